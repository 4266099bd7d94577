"""`sessions-server import-store`: a file whose rows hold texts past the limits is refused, naming
the row and the limit, and nothing is installed; the limits are the same flags as `serve`'s."""

from __future__ import annotations

import base64
import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.storage.paths import object_path
from tests.e2e.conftest import ServerProcess

LONG_ROLE = "r" * 20_000  # past the default 16 KiB


def _import_store(source: Path, data_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sessions_server.cli", "import-store", str(source), "--object-key", "imported"]
    return subprocess.run([*command, "--data-dir", str(data_dir), *flags], capture_output=True, text=True, check=False)


def _store_written(tmp_path: Path, messages: list[dict[str, object]]) -> Path:
    """A copy of the file a server wrote holding `messages`."""
    server = ServerProcess(tmp_path / "origin").start()
    try:
        with SessionsClient(server.address) as client:
            session = client.object("origin").session()
            for message in messages:
                session.append_message(message)
    finally:
        server.stop()
    copy = tmp_path / "upstream.sqlite"
    live = sqlite3.connect(object_path(tmp_path / "origin", "origin"))
    with contextlib.closing(live), contextlib.closing(sqlite3.connect(copy)) as out:
        live.backup(out)
    return copy


def _store_with_a_long_role(tmp_path: Path) -> Path:
    """A store written by a server, then given a role no server would have accepted."""
    text = [{"type": "text", "text": "hi"}]
    copy = _store_written(tmp_path, [{"id": f"m{index}", "role": "user", "parts": text} for index in range(3)])
    with contextlib.closing(sqlite3.connect(copy)) as out:
        out.execute("UPDATE cf_agents_session_messages SET role = ? WHERE id = 'm1'", (LONG_ROLE,))
        out.commit()
    return copy


def test_a_store_with_a_role_past_the_limit_is_refused_until_the_limit_is_raised(tmp_path: Path) -> None:
    source = _store_with_a_long_role(tmp_path)
    data_dir = tmp_path / "data"

    refused = _import_store(source, data_dir)
    assert refused.returncode == 1
    assert "id 'm1': its role is 20000 bytes; the limit is 16384 bytes (max_role_bytes)" in refused.stderr
    assert not object_path(data_dir, "imported").exists()

    done = _import_store(source, data_dir, "--max-role-bytes", "32768")
    assert done.returncode == 0, done.stderr
    server = ServerProcess(data_dir, "--max-role-bytes", "32768").start()
    try:
        with SessionsClient(server.address) as client:
            stats = client.object("imported").session().get_history_row_stats()  # rows' role column
    finally:
        server.stop()
    assert [(s.id, s.role) for s in stats] == [("m0", "user"), ("m1", LONG_ROLE), ("m2", "user")]


def test_a_data_directory_that_cannot_hold_the_object_is_reported_not_raised(tmp_path: Path) -> None:
    source = _store_with_a_long_role(tmp_path)
    not_a_directory = tmp_path / "data"
    not_a_directory.write_text("a file where the data directory should be")
    done = _import_store(source, not_a_directory, "--max-role-bytes", "32768")
    assert done.returncode == 1
    assert done.stderr.startswith("sessions-server import-store: ")
    assert "Traceback" not in done.stderr


def test_an_object_moved_away_comes_back_with_import_store(tmp_path: Path) -> None:
    """import-store did not clear the record of a move away: the object it brought back stayed
    refused (OBJECT_NOT_OWNED), and a start that sets such objects' files aside took it away."""
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir).start()
    message = {"id": "m0", "role": "user", "parts": [{"type": "text", "text": "kept elsewhere"}]}
    try:
        with SessionsClient(server.address) as client:
            client.object("imported").session().append_message(message)
            copy = tmp_path / "copy.sqlite"
            live = sqlite3.connect(object_path(data_dir, "imported"))
            with contextlib.closing(live), contextlib.closing(sqlite3.connect(copy)) as out:
                live.backup(out)
            request = pb.DeleteObjectRequest(object_key="imported", moved_to="elsewhere:1")  # recorded in MOVED
            assert client._stub.DeleteObject(request, metadata=routing_metadata("imported")).deleted
    finally:
        server.stop()

    done = _import_store(copy, data_dir)
    assert done.returncode == 0, done.stderr

    server = ServerProcess(data_dir).start()
    try:
        assert not any("set aside" in line for line in server.startup)
        with SessionsClient(server.address) as client:
            assert client.object("imported").session().get_history() == [message]
    finally:
        server.stop()


def test_the_read_back_bound_is_the_flag_the_server_runs_with(tmp_path: Path) -> None:
    """`import-store` took the default --max-assembly-bytes (512 MiB) whatever the server ran
    with: a server of 1 MiB got files whose messages read back far past it (a review's finding)."""
    image = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 400).decode()  # 136,536 chars
    part = {"type": "file", "mediaType": "image/png", "url": image}
    source = _store_written(tmp_path, [{"id": "m", "role": "user", "parts": [part] * 10}])
    data_dir = tmp_path / "data"

    refused = _import_store(source, data_dir, "--max-assembly-bytes", str(1024 * 1024))
    assert refused.returncode == 1
    assert "id 'm': its JSON with its attachments inline is" in refused.stderr
    assert "(max_assembly_bytes)" in refused.stderr
    assert not object_path(data_dir, "imported").exists()
    done = _import_store(source, data_dir)
    assert done.returncode == 0, done.stderr
