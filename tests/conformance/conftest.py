"""Fixtures of the differential conformance suite: upstream (the oracle in local workerd) and our
server, both started once per test session, and `make_pair` for a fresh object key on both sides.

Node >= 20 is required. Without it every conformance test fails with the reason, unless
SESSIONS_SKIP_CONFORMANCE=1 is set, which skips them (reported as skipped, with the reason).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sessions_client import SessionsClient
from tests.conformance.harness.oracle import ORACLE_DIR, Oracle, OracleProcess
from tests.conformance.harness.ours import OurServerProcess
from tests.conformance.harness.pair import Pair
from tests.conftest import removed_after_passing

SKIP_ENV = "SESSIONS_SKIP_CONFORMANCE"
CONFORMANCE_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SKIP_ENV) != "1":
        return
    marker = pytest.mark.skip(reason=f"conformance suite skipped: {SKIP_ENV}=1")
    for item in items:
        if CONFORMANCE_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(marker)


def _node_problem() -> str | None:
    node = shutil.which("node")
    if node is None:
        return "node is not installed"
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        major = int(version.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"cannot run node: {exc}"
    if major < 20:
        return f"Node >= 20 required, found {version}"
    return None


def _fail(reason: str) -> None:
    pytest.fail(
        f"conformance suite cannot run: {reason}. Install Node >= 20 (the oracle is installed by "
        f"tests/conformance/oracle/ensure.sh), or set {SKIP_ENV}=1 to skip it.",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def oracle_ready() -> None:
    """Node present and the oracle's npm packages installed (npm ci from the project's lock file)."""
    problem = _node_problem()
    if problem:
        _fail(problem)
    result = subprocess.run(["bash", str(ORACLE_DIR / "ensure.sh")], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        _fail(f"oracle install failed: {result.stderr[-3000:]}")


@pytest.fixture(scope="session")
def oracle_process(oracle_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OracleProcess]:
    base = tmp_path_factory.mktemp("oracle")
    process = OracleProcess(base / "persist", base / "oracle.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def oracle(oracle_process: OracleProcess) -> Oracle:
    assert oracle_process.client is not None
    return oracle_process.client


@pytest.fixture(scope="module")
def our_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OurServerProcess]:
    """Our server for a test module (the oracle serves the whole suite), its files removed after it."""
    with removed_after_passing(request, tmp_path_factory.mktemp("ours")) as base:
        server = OurServerProcess(base / "data", base / "server.log")
        server.start()
        yield server
        server.stop()


@pytest.fixture(scope="module")
def our_client(our_server: OurServerProcess) -> Iterator[SessionsClient]:
    with SessionsClient(our_server.address) as client:
        yield client


@pytest.fixture
def make_pair(oracle: Oracle, our_client: SessionsClient, our_server: OurServerProcess) -> Callable[..., Pair]:
    """`make_pair(level="full"|"normal"|"rows", label="...")`: a fresh object key on both sides."""

    def make(level: str = "full", label: str = "") -> Pair:
        return Pair(oracle, our_client, our_server.data_dir, level=level, label=label)

    return make


@pytest.fixture
def pair(make_pair: Callable[..., Pair]) -> Pair:
    return make_pair()  # type: ignore[no-any-return]
