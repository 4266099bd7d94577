"""An object's removal (an erase, or a move's last step) cut short by a crash leaves the object
whole or gone, never an older state of it.

The removal unlinked the WAL first: a crash before the file went left the object as it was at
its last checkpoint, served after the restart with its later acknowledged writes lost (an audit
placed a SIGKILL after that unlink: 20 of 40 appends gone, an acknowledged delete undone). Here
the crash is the removal's own unlink raising, at each of the files it unlinks, on an object
whose WAL holds acknowledged commits (its server was SIGKILLed)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sessions_client import SessionsClient
from sessions_server.storage import files
from sessions_server.storage.datadir import SCRATCH_DIR_NAME
from sessions_server.storage.paths import object_path
from tests.reliability.support import Server
from tests.service.support import text_message

KEY = "removed"


class Crash(Exception):
    """The process dying at this point of the removal."""


def _ids(data_dir: Path) -> list[str]:
    server = Server(data_dir).start()
    try:
        with SessionsClient(server.address) as client:
            return [message["id"] for message in client.object(KEY).session().get_history()]
    finally:
        server.stop()


@pytest.mark.parametrize("dies_at", ["-wal", "-shm", "the file"])
def test_a_removal_cut_short_leaves_the_object_whole_or_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dies_at: str
) -> None:
    data_dir = tmp_path / "data"
    checkpointed = [f"m{i}" for i in range(20)]
    in_the_wal = [f"m{i}" for i in range(20, 40)]
    server = Server(data_dir).start()
    try:
        with SessionsClient(server.address) as client:
            for message_id in checkpointed:
                client.object(KEY).session().append_message(text_message(message_id, message_id))
    finally:
        server.stop()
    path = object_path(data_dir, KEY)
    with contextlib.closing(sqlite3.connect(path)) as conn:  # these go into the file itself
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    server = Server(data_dir).start()
    with SessionsClient(server.address) as client:
        for message_id in in_the_wal:
            client.object(KEY).session().append_message(text_message(message_id, message_id))
    server.kill()  # these stay in the WAL
    assert Path(f"{path}-wal").stat().st_size > 0

    unlink = Path.unlink

    def dying_unlink(self: Path, *args: Any, **kwargs: Any) -> None:
        if self.name.endswith(dies_at) or (dies_at == "the file" and self.name.endswith(path.suffix)):
            raise Crash(str(self))
        unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", dying_unlink)
    with pytest.raises(Crash):
        files.remove_object_files(path, data_dir / SCRATCH_DIR_NAME)
    monkeypatch.setattr(Path, "unlink", unlink)

    after = _ids(data_dir)
    assert after in ([], checkpointed + in_the_wal), f"neither whole nor gone: {len(after)} messages"
    # A WAL the crash left without its file is not replayed into the key's next file.
    server = Server(data_dir).start()
    try:
        with SessionsClient(server.address) as client:
            client.object(KEY).session().append_message(text_message("next", "next"))
            history = client.object(KEY).session().get_history()
    finally:
        server.stop()
    assert [message["id"] for message in history] == [*after, "next"]
