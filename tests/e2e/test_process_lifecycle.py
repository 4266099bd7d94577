"""The server process: crash safety of acknowledged writes, graceful shutdown, restart."""

from __future__ import annotations

import re
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_client import SessionsClient
from sessions_server.storage.paths import object_path
from tests.deploy.support import free_port
from tests.e2e.conftest import ServerProcess


def _message(index: int, size: int = 64) -> dict[str, object]:
    return {"id": f"m{index}", "role": "user", "parts": [{"type": "text", "text": f"{index}:" + "x" * size}]}


def test_acknowledged_writes_survive_sigkill(server_process: ServerProcess) -> None:
    acknowledged: list[dict[str, object]] = []
    with SessionsClient(server_process.address) as client:
        session = client.object("crash-object").session()
        for index in range(200):
            size = 2_000_000 if index % 50 == 7 else 64  # some messages span continuation rows
            message = _message(index, size)
            assert session.append_message(message).inserted
            acknowledged.append(message)
    assert server_process.signal(signal.SIGKILL) == -signal.SIGKILL

    restarted = ServerProcess(server_process.data_dir).start()
    try:
        with SessionsClient(restarted.address) as client:
            history = client.object("crash-object").session().get_history()
        assert history == acknowledged
    finally:
        restarted.stop()
    conn = sqlite3.connect(object_path(server_process.data_dir, "crash-object"))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_concurrent_writers_then_sigkill_lose_nothing_acknowledged(server_process: ServerProcess) -> None:
    writers, writes = 6, 60
    acknowledged: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(worker: int) -> None:
        try:
            with SessionsClient(server_process.address) as client:
                session = client.object(f"object-{worker % 3}").session(f"s{worker}")
                for index in range(writes):
                    message_id = f"w{worker}-{index}"
                    session.append_message({"id": message_id, "role": "user", "parts": []})
                    with lock:
                        acknowledged.setdefault(f"object-{worker % 3}/s{worker}", []).append(message_id)
        except BaseException as error:  # reported by the test thread
            with lock:
                errors.append(error)

    threads = [threading.Thread(target=writer, args=(worker,)) for worker in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    expected = {
        f"object-{worker % 3}/s{worker}": [f"w{worker}-{index}" for index in range(writes)] for worker in range(writers)
    }
    assert acknowledged == expected  # every write was acknowledged before the kill
    assert server_process.signal(signal.SIGKILL) == -signal.SIGKILL

    restarted = ServerProcess(server_process.data_dir).start()
    try:
        with SessionsClient(restarted.address) as client:
            for name, ids in expected.items():
                key, session_id = name.split("/")
                stored = [m["id"] for m in client.object(key).session(session_id).history()]
                assert stored == ids, name
    finally:
        restarted.stop()


def test_sigterm_drains_and_exits_cleanly(server_process: ServerProcess) -> None:
    with SessionsClient(server_process.address) as client:
        client.object("drain").session().append_message(_message(1))
    channel = grpc.insecure_channel(server_process.address)
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    channel.close()
    assert server_process.signal(signal.SIGTERM) == 0
    path: Path = object_path(server_process.data_dir, "drain")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT id FROM cf_agents_session_messages").fetchall() == [("m1",)]
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_restart_keeps_active_leaf_and_seq(server_process: ServerProcess) -> None:
    with SessionsClient(server_process.address) as client:
        session = client.object("restart").session()
        session.append_message(_message(1))
        session.append_message(_message(2))
        session.append_message(_message(3), parent_id="m1")  # a branch becomes the active leaf
    server_process.signal(signal.SIGTERM)
    restarted = ServerProcess(server_process.data_dir).start()
    try:
        with SessionsClient(restarted.address) as client:
            session = client.object("restart").session()
            assert session.get_latest_leaf() == _message(3)
            assert session.append_message(_message(4)).parent_id == "m3"
        conn = sqlite3.connect(object_path(server_process.data_dir, "restart"))
        assert conn.execute("SELECT seq FROM cf_agents_session_messages WHERE id = 'm4'").fetchone() == (4,)
        conn.close()
    finally:
        restarted.stop()


def test_uvloop_by_default_and_asyncio_on_request(tmp_path: Path) -> None:
    """Both event loops serve the same contract; the default is uvloop (installed with the server)."""
    for choice, expected in (("auto", "uvloop"), ("asyncio", "asyncio")):
        server = ServerProcess(tmp_path / choice, "--event-loop", choice).start()
        try:
            assert f"loop: {expected})" in server.banner
            with SessionsClient(server.address) as client:
                session = client.object("loop-object").session()
                assert session.append_message(_message(1)).inserted
                assert session.get_history() == [_message(1)]
            assert server.signal(signal.SIGTERM) == 0
        finally:
            server.stop()


def _young_collections(metrics_port: int) -> int:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    match = re.search(r'^python_gc_collections_total\{generation="0"\} (\d+)', body, re.MULTILINE)
    assert match, body
    return int(match.group(1))


def test_the_garbage_collector_stays_off_the_request_path(tmp_path: Path) -> None:
    """With CPython's default threshold each 100-message append ran about two young collections."""
    metrics_port = free_port()
    server = ServerProcess(tmp_path, "--metrics-listen", f"127.0.0.1:{metrics_port}").start()
    try:
        assert f", metrics: 127.0.0.1:{metrics_port})" in server.banner  # where to scrape, as it starts
        with SessionsClient(server.address) as client:
            session = client.object("gc-object").session()
            session.append_messages([_message(index, 900) for index in range(100)])  # warm: opens the object
            before = _young_collections(metrics_port)
            calls = 40
            for call in range(1, calls + 1):
                session.append_messages([_message(call * 100 + index, 900) for index in range(100)])
            young = _young_collections(metrics_port) - before
        assert young < calls / 4, f"{young} young collections during {calls} appends of 100 messages"
    finally:
        server.stop()


def _refused_at_start(data_dir: Path, *flags: str) -> str:
    """`serve` with `flags` refused before it starts (exit 2): what it said."""
    done = subprocess.run(
        [sys.executable, "-m", "sessions_server.cli", "serve", "--data-dir", str(data_dir), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    return done.stderr


@pytest.mark.parametrize("flag", ["--progress-seconds", "--search-seconds", "--max-concurrent-searches"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_budget_of_zero_or_less_is_refused_at_start(tmp_path: Path, flag: str, value: str) -> None:
    """`--progress-seconds 0` made every idle subscription spin (35,000 progress events in 2 s)."""
    assert f"{flag} must be greater than 0" in _refused_at_start(tmp_path, flag, value)


def test_a_progress_interval_too_short_to_be_idle_is_refused_at_start(tmp_path: Path) -> None:
    """1e-7 was taken, and a subscription sent 10,324 progress events in 3 s."""
    assert "--progress-seconds must be at least 0.05" in _refused_at_start(tmp_path, "--progress-seconds", "1e-7")


def test_a_negative_stream_share_per_token_is_refused_at_start(tmp_path: Path) -> None:
    stderr = _refused_at_start(tmp_path, "--max-streams-per-token", "-1")
    assert "--max-streams-per-token must be 0 (no bound of its own) or more" in stderr


def test_retired_queue_flags_are_accepted_with_a_warning(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--subscriber-queue-events", "5").start()
    try:
        assert any("--subscriber-queue-events is no longer used" in line for line in server.startup)
        with SessionsClient(server.address) as client:
            assert client.object("k").session().append_message(_message(1)).inserted
        assert server.signal(signal.SIGTERM) == 0
    finally:
        server.stop()


def test_the_open_files_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    """An open object takes up to fifteen descriptors (five connections, each with its file, WAL
    and shared memory): the common soft limit of 1,024 ran out under --max-open-objects 256."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, soft)
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.fail(f"this machine's hard limit ({hard}) leaves nothing to raise to")

    server = ServerProcess(tmp_path / "data")
    # Lowered by a launcher that then becomes the server (exec): a `preexec_fn` runs Python in a
    # forked child of this many-threaded test process, which gRPC's fork handlers abort.
    lower = "import os, resource, sys; limits = int(sys.argv[1]), int(sys.argv[2]);"
    lower += " resource.setrlimit(resource.RLIMIT_NOFILE, limits); os.execv(sys.argv[3], sys.argv[3:])"
    server.launcher = [sys.executable, "-c", lower, str(low), str(hard)]
    server.start()
    try:
        assert server.proc is not None
        limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
        line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
        raised = int(line.split()[3])
        assert raised > low
        assert raised == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
    finally:
        server.stop()
