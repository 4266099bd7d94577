"""Shared fixtures: a real server on a loopback port with real SQLite files, and clients.

The server runs in-process on its own event loop thread (tests/e2e start it as a subprocess
instead). Each test gets a fresh object key, so tests share a server but never an object.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvloop

from sessions_server.config import ServerConfig
from sessions_server.domain import paths
from sessions_server.transport.server import RunningServer, create_server

RESERVED_KEYS = ("reserved", "channel")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files marked `long` first, each kept whole (the sort is stable): when the suite runs in
    several processes a file at a time, a file of minutes handed out last ran on alone after the
    others were done."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture
def fresh_memo(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An empty path and message memo (domain/paths.py: what other tests left is not ours to
    count) whose budgets a test may change; all of it is put back afterwards."""
    monkeypatch.setattr(paths, "_paths", OrderedDict())
    monkeypatch.setattr(paths, "_path_bytes", 0)
    monkeypatch.setattr(paths, "_views", OrderedDict())
    monkeypatch.setattr(paths, "_view_bytes", 0)
    monkeypatch.setattr(paths, "MAX_VIEW_BYTES", paths.MAX_VIEW_BYTES)
    monkeypatch.setattr(paths, "MAX_SESSION_VIEW_BYTES", paths.MAX_SESSION_VIEW_BYTES)
    return monkeypatch


@dataclass
class LiveServer:
    """A server running on a background event loop."""

    address: str
    data_dir: Path
    running: RunningServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.stop(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def start_server(data_dir: Path, listen: str = "127.0.0.1:0", **overrides: object) -> LiveServer:
    """Starts a server bound to `listen` (a free port by default) with `data_dir`; returns once
    it is serving. It runs on uvloop, the event loop `sessions-server serve` picks (asyncio:
    tests/e2e)."""
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-server-loop", daemon=True)
    thread.start()
    settings: dict[str, object] = {"reserved_metadata_keys": RESERVED_KEYS, "drain_seconds": 5.0, **overrides}
    config = ServerConfig(data_dir=data_dir, listen=listen, **settings)  # type: ignore[arg-type]
    started: Future[RunningServer] = asyncio.run_coroutine_threadsafe(create_server(config), loop)
    running = started.result(timeout=30)
    return LiveServer(running.address, data_dir, running, loop, thread)


@contextmanager
def removed_after_passing(request: pytest.FixtureRequest, path: Path) -> Iterator[Path]:
    """`path`, removed when the fixture's scope ends unless a test failed meanwhile (its files
    are kept for a look, as pytest keeps a failed test's `tmp_path`)."""
    failed_before = request.session.testsfailed
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def live_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for a test module, its files removed after it (one server for the whole suite
    held 770 MB of objects by the end)."""
    with removed_after_passing(request, tmp_path_factory.mktemp("data")) as data_dir:
        server = start_server(data_dir)
        yield server
        server.stop()


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[object]:
    from sessions_client import SessionsClient

    with SessionsClient(live_server.address) as sessions:
        yield sessions


@pytest.fixture
def object_key() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
def obj(client: object, object_key: str) -> object:
    return client.object(object_key)  # type: ignore[attr-defined]


@pytest.fixture
def session(obj: object) -> object:
    return obj.session()  # type: ignore[attr-defined]
