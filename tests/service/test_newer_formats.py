"""Files of a newer format of this service's files, through a real server: a server refuses an
object whose file records a format newer than its own (`schema.FILE_FORMAT`) with
FAILED_PRECONDITION (reason FAILED_PRECONDITION) naming both formats, reads and writes alike, and
leaves the file byte for byte as it was; it is not damage, so nothing is quarantined. A file of a
server from before formats were recorded gains the record on its first open. ImportObject and
`import-store` refuse a newer format's file before anything is replaced, and export copies carry
the record (so it travels with the file).

A rollback is played by writing with this server, stopping it, and recording format 2 in the
file as a newer server would, then starting a server on the same data directory again."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsError
from sessions_client.admin import export_file, import_file
from tests.service.support import message_rows, text_message
from tests.service.test_damaged_objects import _digest, _errors_logged, _refusal, _relative, _serving
from tests.storage.test_format_record import _recorded, _set_format

KEY = "rolled-back"
MESSAGES = [text_message("m1", "first"), text_message("m2", "second", role="assistant"), text_message("m3")]


def _written(data: Path) -> Path:
    """The object with MESSAGES, written by this server, which is then stopped (its WAL
    checkpointed away); returns the object's file."""
    with _serving(data) as (_, client):
        client.object(KEY).session().append_messages(MESSAGES)
    return data / _relative(data, KEY)


def _assert_newer_format_refusal(error: SessionsError, data: Path) -> None:
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION"), error
    relative = _relative(data, KEY)
    assert error.message == (
        f"the object's file ({relative}) is in format 2 of this service's files, newer than the 1 this server "
        "knows: a newer server wrote it, and this one would misread it. Nothing was read from it or written to "
        "it: run a server at least as new as the one that wrote it"
    )
    assert error.metadata["file"] == relative


def _wal_is_empty(path: Path) -> bool:
    wal = Path(f"{path}-wal")
    return not wal.exists() or wal.stat().st_size == 0


def test_a_file_of_a_newer_format_is_refused_for_reads_and_writes_and_left_byte_for_byte(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    path = _written(data)
    _set_format(path, "2")  # as a newer server, whose data directory this one was rolled back onto, left it
    before = _digest(path)

    with caplog.at_level(logging.INFO), _serving(data) as (_, client):
        session = client.object(KEY).session()
        for call in (
            session.get_history,
            lambda: session.get_message("m1"),
            lambda: session.append_message(text_message("m4")),
            lambda: session.update_message(text_message("m1", "changed")),
        ):
            _assert_newer_format_refusal(_refusal(call), data)
            assert _digest(path) == before
            assert _wal_is_empty(path)
        logged = _errors_logged(caplog)
        assert len(logged) == 1, [record.getMessage() for record in logged]  # once a minute an object
        assert logged[0].getMessage().startswith(f"object of a newer server: object {KEY!r}, file ")
        assert "format 2" in logged[0].getMessage()

        # Not quarantined as damage: once the file is in a format this server knows, it is served.
        _set_format(path, "1")
        assert session.get_history() == MESSAGES


def test_a_file_of_a_server_before_formats_gains_the_record_on_first_open_and_reads_unchanged(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    path = _written(data)
    _set_format(path, None)  # as every server before formats were recorded left its files
    rows = message_rows(data, KEY)

    with _serving(data) as (_, client):
        assert client.object(KEY).session().get_history() == MESSAGES
        assert _recorded(path) == {"object_key": KEY, "format": "1"}
    assert message_rows(data, KEY) == rows


def test_an_export_copy_carries_the_format_record_to_where_it_is_imported(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _written(data)
    copy = tmp_path / "exported.sqlite"
    with _serving(data) as (_, client):
        export_file(client, KEY, copy)
        assert _recorded(copy) == {"object_key": KEY, "format": "1"}
        import_file(client, "arrived", copy)
        assert client.object("arrived").session().get_history() == MESSAGES
        assert _recorded(data / _relative(data, "arrived")) == {"object_key": "arrived", "format": "1"}


def test_an_import_of_a_newer_format_file_is_refused_and_the_object_stays(tmp_path: Path) -> None:
    """ImportObject (`import_file`, with replace) and offline `import-store --replace` alike."""
    data = tmp_path / "data"
    path = _written(data)
    copy = tmp_path / "exported.sqlite"
    with _serving(data) as (_, client):
        export_file(client, KEY, copy)
        _set_format(copy, "2")  # as a newer server's export
        rows = message_rows(data, KEY)

        with pytest.raises(SessionsError) as refused:
            import_file(client, KEY, copy, replace=True)
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
        assert refused.value.message == (
            "the received file cannot be served: it holds format 2 of this service's files, newer than the 1 this "
            "server knows: bring it into a server at least as new as the one that wrote it"
        )
        assert client.object(KEY).session().get_history() == MESSAGES
        assert message_rows(data, KEY) == rows
    before = _digest(path)

    command = [sys.executable, "-m", "sessions_server.cli", "import-store", str(copy), "--object-key", KEY]
    offline = subprocess.run(
        [*command, "--data-dir", str(data), "--replace"], capture_output=True, text=True, check=False
    )

    assert offline.returncode == 1, offline
    assert offline.stderr == (
        f"sessions-server import-store: {copy} holds format 2 of this service's files, newer than the 1 this "
        "server knows: bring it into a server at least as new as the one that wrote it\n"
    )
    assert _digest(path) == before
    assert message_rows(data, KEY) == rows
    with contextlib.closing(sqlite3.connect(f"file:{copy}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT value FROM _sessions_meta WHERE key = 'format'").fetchone() == ("2",)
