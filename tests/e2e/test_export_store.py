"""`sessions-server export-store`: an object's file saved from a running server, which
`import-store` takes back; a file already there is kept unless --force, and a failed export
leaves nothing behind."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

from sessions_client import SessionsClient
from tests.e2e.conftest import ServerProcess


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sessions_server.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _message(message_id: str) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": f"text of {message_id}"}]}


def test_an_exported_file_is_imported_back_whole(server_process: ServerProcess, tmp_path: Path) -> None:
    with SessionsClient(server_process.address) as client:
        for index in range(12):
            client.object("saved/one").session("s").append_message(_message(f"m{index}"))
        saved = tmp_path / "out" / "one.sqlite"
        saved.parent.mkdir()

        done = _cli("export-store", str(saved), "--object-key", "saved/one", "--from", server_process.address)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"saved object 'saved/one' from {server_process.address} to {saved}: ")
        assert done.stdout.rstrip().endswith(" bytes, 12 messages")
        assert sorted(p.name for p in saved.parent.iterdir()) == ["one.sqlite"]  # no partial copy beside it
        with contextlib.closing(sqlite3.connect(f"file:{saved}?mode=ro", uri=True)) as copy:
            assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)

        client.object("saved/one").session("s").append_message(_message("later"))
        again = _cli("export-store", str(saved), "--object-key", "saved/one", "--from", server_process.address)
        assert again.returncode == 1
        assert f"{saved} exists: nothing was written; pass --force to overwrite it" in again.stderr
        forced = _cli(
            "export-store", str(saved), "--object-key", "saved/one", "--from", server_process.address, "--force"
        )
        assert forced.returncode == 0, forced.stderr
        assert forced.stdout.rstrip().endswith(" bytes, 13 messages")

        back = _cli("import-store", str(saved), "--object-key", "saved/copy", "--to", server_process.address)
        assert back.returncode == 0, back.stderr
        original = client.object("saved/one").session("s").get_history()
        assert client.object("saved/copy").session("s").get_history() == original
        assert [m["id"] for m in original] == [*(f"m{index}" for index in range(12)), "later"]


def test_an_object_the_server_does_not_hold_leaves_no_file(server_process: ServerProcess, tmp_path: Path) -> None:
    target = tmp_path / "none.sqlite"
    done = _cli("export-store", str(target), "--object-key", "never/written", "--from", server_process.address)
    assert done.returncode == 1
    assert "NOT_FOUND" in done.stderr and "no such object" in done.stderr
    assert not target.exists() and not list(tmp_path.glob(".none.sqlite.*"))


def test_a_directory_given_as_the_file_is_refused_before_anything_is_sent(
    server_process: ServerProcess, tmp_path: Path
) -> None:
    """With --force, the whole object came, and the rename into place then failed with Python's
    "[Errno 21] Is a directory" naming the partial copy."""
    with SessionsClient(server_process.address) as client:
        client.object("saved/dir").session().append_message(_message("m1"))
    target = tmp_path / "adir"
    target.mkdir()
    done = _cli("export-store", str(target), "--object-key", "saved/dir", "--from", server_process.address, "--force")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"sessions-server export-store: {target} is a directory: nothing was exported; give a file's path"
    )
    assert list(target.iterdir()) == [] and not list(tmp_path.glob(".adir.*"))
