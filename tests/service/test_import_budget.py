"""An import's messages count against --max-assembly-bytes until their write is done, as an
append's do while it is written. The import gave a message's charge back as soon as it handed
the message to its writer, and never charged whole messages packed into frames, while it went on
receiving: an import of 80 MB messages held four of them outside the budget, and three imports
at once took far more memory than three appenders under the same budget.

The hold point is each of the import's write jobs (`import_all_in`, on the writer thread): the
server's assembly gauge is read there, while the job's messages are being written."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessions_client import RetryNotice, SessionsClient
from sessions_server.domain import imports
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server
from tests.service.support import message_of_json_size

MIB = 1024 * 1024


class Jobs:
    """For each of the import's write jobs: its messages' JSON bytes, and the gauge meanwhile."""

    def __init__(self, server: LiveServer, sizes: dict[str, int]) -> None:
        self.server = server
        self.sizes = sizes
        self.seen: list[tuple[int, float]] = []
        self.lock = threading.Lock()

    def gauge(self) -> float:
        return self.server.running.metrics.registry.get_sample_value("sessions_assembly_bytes") or 0.0


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Jobs]:
    server = start_server(tmp_path / "data", limits=Limits(max_assembly_bytes=16 * MIB))
    observed = Jobs(server, {})
    written = imports.import_all_in

    def import_all_in(ctx: Any, session_id: str, rows: Any, *args: Any) -> Any:
        with observed.lock:
            observed.seen.append((sum(observed.sizes[row.id] for row in rows), observed.gauge()))
        return written(ctx, session_id, rows, *args)

    monkeypatch.setattr(imports, "import_all_in", import_all_in)
    try:
        yield observed
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("count", "size"),
    [
        pytest.param(2, 5 * MIB, id="messages-in-pieces"),
        pytest.param(40, 100 * 1024, id="whole-messages-in-frames"),
    ],
)
def test_an_imported_message_stays_charged_until_its_write_is_done(jobs: Jobs, count: int, size: int) -> None:
    messages = [message_of_json_size(f"m{index}", size) for index in range(count)]
    jobs.sizes.update((message["id"], size) for message in messages)
    notices: list[RetryNotice] = []
    with SessionsClient(jobs.server.address, retry=None, on_retry=notices.append) as client:
        result = client.object("k").session().import_messages(messages)
    assert (result.imported, result.skipped) == (count, 0)
    assert jobs.seen, "no write job was observed"
    uncharged = [(job_bytes, gauge) for job_bytes, gauge in jobs.seen if gauge < job_bytes]
    assert uncharged == [], f"(bytes being written, bytes charged) of jobs written outside the budget: {uncharged}"
    assert jobs.gauge() == 0  # all given back once written


def test_an_import_waits_for_its_own_writes_rather_than_refuse_its_next_message(tmp_path: Path) -> None:
    """Messages of 5 MiB under a budget of 8 MiB: the second arrives while the first, still
    charged, is being written. It waits for that write (which gives its charge back) instead of
    being refused SERVER_BUSY for what the import itself holds."""
    server = start_server(tmp_path / "data", limits=Limits(max_assembly_bytes=8 * MIB))
    try:
        messages = [message_of_json_size(f"m{index}", 5 * MIB) for index in range(3)]
        with SessionsClient(server.address, retry=None) as client:
            result = client.object("k").session().import_messages(messages)
            assert (result.imported, result.skipped) == (3, 0)
        assert server.running.metrics.registry.get_sample_value("sessions_assembly_bytes") == 0
    finally:
        server.stop()
