"""VacuumObject's rewrites through a real server: at most MAX_CONCURRENT_REWRITES at once,
server-wide (each holds one of the threads that commit every object's writes: eight vacuums of
80 MB objects stalled an append to another object for 9 s), and one whose caller is gone before
its turn is not run (20 calls that gave up at once left 84 s of rewrites before the next
append). The rewrites are held at their copy by a gate around the real copy."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_server.domain.objects import MAX_CONCURRENT_REWRITES
from sessions_server.storage import store as store_module
from tests.conftest import start_server
from tests.service.support import ids, text_message

GATE_SECONDS = 30.0  # a bound on every wait below, should the code under test never get there


def test_rewrites_take_turns_server_wide_and_one_whose_caller_left_before_its_turn_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = store_module.files.snapshot_object
    begun: list[Path] = []
    entered, release = threading.Semaphore(0), threading.Event()

    def gated_snapshot(path: Path, directory: Path, row_writes: int) -> Path:
        begun.append(path)
        entered.release()
        release.wait(GATE_SECONDS)
        return snapshot(path, directory, row_writes)

    monkeypatch.setattr(store_module.files, "snapshot_object", gated_snapshot)
    keys = [f"vacuumed-{index}" for index in range(MAX_CONCURRENT_REWRITES + 1)]
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None, timeout=GATE_SECONDS) as client:
            for key in keys:
                client.object(key).session().append_message(text_message("m1", key))
            with ThreadPoolExecutor(len(keys)) as pool:
                held = [pool.submit(client.object(key).vacuum) for key in keys[:-1]]
                for _ in held:
                    assert entered.acquire(timeout=GATE_SECONDS)
                # Every slot is taken: the next vacuum waits its turn until its deadline.
                with (
                    SessionsClient(server.address, retry=None, timeout=1.0) as impatient,
                    pytest.raises(SessionsError) as gave_up,
                ):
                    impatient.object(keys[-1]).vacuum()
                assert gave_up.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
                # Meanwhile another object's writes go on.
                other = client.object("written-meanwhile").session()
                assert other.append_message(text_message("w1", "not held")).inserted
                release.set()
                for call in held:
                    call.result(timeout=GATE_SECONDS)
            assert ids(client.object(keys[-1]).session().get_history()) == ["m1"]
    finally:
        release.set()
        server.stop()  # waits for every call's work, the abandoned vacuum's included
    assert len(begun) == MAX_CONCURRENT_REWRITES
