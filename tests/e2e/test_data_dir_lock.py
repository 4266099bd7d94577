"""One server per data directory: a second `serve`, an `import-store` or a Litestream restore on a
directory a running server owns is refused with a line naming that server, and changes nothing;
once the server is gone (stopped, or killed without a chance to clean up) the directory is free
again."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.storage.datadir import SCRATCH_DIR_NAME
from sessions_server.storage.paths import object_path
from tests.e2e.conftest import ServerProcess

RESTORE_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "litestream" / "restore.sh"


def _text(message_id: str) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]}


def _import_store(source: Path, key: str, *where: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sessions_server.cli", "import-store", str(source), "--object-key", key]
    return subprocess.run([*command, *where], capture_output=True, text=True, timeout=120, check=False)


def _upstream_like_store(tmp_path: Path) -> Path:
    """A store file to import, written by a server of its own."""
    origin = ServerProcess(tmp_path / "origin").start()
    try:
        with SessionsClient(origin.address) as client:
            client.object("origin").session().append_message(_text("from-origin"))
    finally:
        origin.stop()
    copy = tmp_path / "store.sqlite"
    live = sqlite3.connect(object_path(tmp_path / "origin", "origin"))
    with contextlib.closing(live), contextlib.closing(sqlite3.connect(copy)) as out:
        live.backup(out)
    return copy


def test_a_data_directory_has_one_owner_at_a_time(tmp_path: Path) -> None:
    source = _upstream_like_store(tmp_path)
    data_dir = tmp_path / "data"
    first = ServerProcess(data_dir).start()
    try:
        assert first.proc is not None
        holder = f"pid {first.proc.pid} (sessions-server serve)"
        with SessionsClient(first.address) as client:
            client.object("chat").session().append_message(_text("m1"))

        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "sessions_server.cli",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(data_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 1
        assert second.stderr.endswith(
            f"sessions-server: data directory {data_dir} is in use by {holder}: one server owns a data "
            "directory at a time; stop that one first, or give this one its own --data-dir\n"
        )
        assert "listening" not in second.stdout

        refused = _import_store(source, "imported", "--data-dir", str(data_dir))
        assert refused.returncode == 1
        assert refused.stderr == (
            f"sessions-server import-store: data directory {data_dir} is in use by {holder}: stop it first, "
            "or send the file to it with --to ADDRESS\n"
        )
        assert not object_path(data_dir, "imported").exists()

        sent = _import_store(source, "imported", "--to", first.address)  # through the owner: ImportObject
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout == f"imported {source} as object 'imported' on {first.address}: 1 messages\n"
        again = _import_store(source, "imported", "--to", first.address)
        assert again.returncode == 1
        assert f"FAILED_PRECONDITION [OBJECT_EXISTS]: {first.address} already holds object 'imported'" in again.stderr
        assert "import again with --replace to overwrite it" in again.stderr
        assert _import_store(source, "imported", "--to", first.address, "--replace").returncode == 0
        not_a_store = tmp_path / "notes.txt"
        not_a_store.write_text("not SQLite " * 100)
        garbage = _import_store(not_a_store, "garbage", "--to", first.address)
        assert garbage.returncode == 1
        assert f"INVALID_ARGUMENT: {not_a_store} is not a usable SQLite store" in garbage.stderr

        restore = subprocess.run(  # refused before it looks at the replica
            ["bash", str(RESTORE_SCRIPT), "--replica", str(tmp_path / "no-replica"), "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert restore.returncode == 1
        assert f"restore.sh: data directory {data_dir} is in use by {holder}: stop it first" in restore.stderr

        with SessionsClient(first.address) as client:  # the owner goes on as before
            session = client.object("chat").session()
            session.append_message(_text("m2"))
            assert [m["id"] for m in session.get_history()] == ["m1", "m2"]

        assert first.signal(signal.SIGKILL) == -signal.SIGKILL  # no clean-up: the kernel frees the lock
    finally:
        first.stop()

    done = _import_store(source, "imported-offline", "--data-dir", str(data_dir))
    assert done.returncode == 0, done.stderr
    restarted = ServerProcess(data_dir).start()
    try:
        with SessionsClient(restarted.address) as client:
            assert [m["id"] for m in client.object("chat").session().get_history()] == ["m1", "m2"]
            for key in ("imported", "imported-offline"):
                assert [m["id"] for m in client.object(key).session().get_history()] == ["from-origin"]
            assert client.object("garbage").list_sessions() == []
    finally:
        restarted.stop()


def test_a_snapshot_a_crash_left_in_scratch_is_removed_when_the_owner_starts(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir).start()
    try:
        with SessionsClient(server.address) as client:
            session = client.object("big").session()
            for index in range(20):  # 30 MB, past what flow control lets ahead: the stream stays open
                session.append_message(_text(f"m{index}") | {"parts": [{"type": "text", "text": "x" * 1_500_000}]})
            export = client._stub.ExportObject(
                pb.ExportObjectRequest(object_key="big"), metadata=routing_metadata("big")
            )
            first = next(export)
            assert first.size_bytes > len(first.data) > 0
            snapshots = list((data_dir / SCRATCH_DIR_NAME).iterdir())
            assert [p.name.startswith("export-") for p in snapshots] == [True]
            assert server.signal(signal.SIGKILL) == -signal.SIGKILL  # mid-export: the copy stays behind
            export.cancel()
    finally:
        server.stop()
    assert snapshots[0].stat().st_size == first.size_bytes

    restarted = ServerProcess(data_dir).start()
    try:
        assert list((data_dir / SCRATCH_DIR_NAME).iterdir()) == []
        with SessionsClient(restarted.address) as client:  # the object itself is untouched
            assert len(client.object("big").session().get_history()) == 20
    finally:
        restarted.stop()
