"""Damaged object files through a real server: SQLite reporting an object's file corrupt or not a
database, on open or on a read, or another program's database at its path, answers DATA_LOSS with
reason OBJECT_DAMAGED naming the file relative to the data directory; every later call on the
object, writes included, is refused so and leaves the file as it is, until ImportObject with
replace or DeleteObject with erase; the server logs it at ERROR once, not once per call.

The files are damaged while the server that wrote them is stopped (its objects closed, their
WALs checkpointed away), then a second server is started on the same data directory."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_client.admin import erase_object, export_file, import_file
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage import rows
from sessions_server.storage.paths import object_path
from sessions_server.storage.schema import NEW_FILE_PAGE_SIZE
from tests.conftest import LiveServer, start_server
from tests.service.support import error_reason, ids, text_message

DAMAGED = "damaged"
GOOD = "good"
ROWS = 300
LOGGER = "sessions.objects"


@contextlib.contextmanager
def _serving(data: Path) -> Iterator[tuple[LiveServer, SessionsClient]]:
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None, timeout=30) as client:
            yield server, client
    finally:
        server.stop()


def _written(data: Path, rows_by_key: dict[str, int]) -> None:
    """The objects with that many messages of about 1.5 KB each, then the server stopped."""
    with _serving(data) as (_, client):
        for key, count in rows_by_key.items():
            session = client.object(key).session()
            session.append_messages([text_message(f"m{i}", f"alpha beta {i} " + "z" * 1500) for i in range(count)])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _relative(data: Path, key: str) -> str:
    return str(object_path(data, key).relative_to(data))


def _corrupt_interior_pages(path: Path) -> None:
    """The middle of every other page in the file's second half (the messages' pages; the
    tables' root pages, written first, are left): the file opens, a read of the messages fails."""
    pages = path.stat().st_size // NEW_FILE_PAGE_SIZE
    with path.open("r+b") as file:
        for page in range(pages // 2, pages, 2):
            file.seek(page * NEW_FILE_PAGE_SIZE + 200)
            file.write(b"\xff" * (NEW_FILE_PAGE_SIZE // 2))  # random bytes now and then read as a too-long string


def _refusal(call: Callable[[], Any]) -> SessionsError:
    with pytest.raises(SessionsError) as refused:
        call()
    return refused.value


def _assert_damaged(error: SessionsError, data: Path, key: str) -> None:
    assert (error.code, error.reason) == (grpc.StatusCode.DATA_LOSS, "OBJECT_DAMAGED"), error
    relative = _relative(data, key)
    assert relative.startswith("objects/") and relative in error.message
    assert error.metadata["file"] == relative
    assert str(data) not in error.message  # the server's own paths are not the caller's business
    assert "ImportObject with replace" in error.message and "DeleteObject with erase" in error.message


def _errors_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_an_object_a_read_finds_damaged_refuses_every_call_logs_once_and_is_restored_by_import(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    _written(data, {DAMAGED: ROWS, GOOD: 3})
    path = object_path(data, DAMAGED)
    _corrupt_interior_pages(path)
    before = _digest(path)
    good_copy = tmp_path / "good.sqlite"

    with caplog.at_level(logging.INFO), _serving(data) as (_, client):
        session = client.object(DAMAGED).session()
        found = _refusal(session.get_history)
        _assert_damaged(found, data, DAMAGED)
        assert "malformed" in found.message  # SQLite's words
        for call in (
            lambda: session.append_message(text_message("new", "after the damage")),
            lambda: session.update_message(text_message("m7", "changed")),
            lambda: session.delete_messages(["m8"]),
            session.get_latest_leaf,
            lambda: session.get_message("m5"),
            lambda: session.search("alpha"),
            lambda: client.object(DAMAGED).get_object_stats(),
            session.get_history,
        ):
            _assert_damaged(_refusal(call), data, DAMAGED)
        assert _digest(path) == before

        # A client's mistake on another object is no storage failure: nothing at ERROR for it.
        bad = _refusal(lambda: client.object(GOOD).session().append_message("{not json"))
        assert bad.code == grpc.StatusCode.INVALID_ARGUMENT

        logged = _errors_logged(caplog)
        assert len(logged) == 1, [record.getMessage() for record in logged]
        line = logged[0].getMessage()
        assert logged[0].name == LOGGER
        assert line.startswith("object damaged:")
        assert repr(DAMAGED) in line and _relative(data, DAMAGED) in line and "malformed" in line
        assert "during read" in line

        # Restored from a copy (ImportObject with replace): served again, and written to.
        export_file(client, GOOD, good_copy)
        import_file(client, DAMAGED, good_copy, replace=True)
        assert ids(session.get_history()) == ["m0", "m1", "m2"]
        assert session.append_message(text_message("after", "restored")).inserted
        assert ids(session.get_history())[-1] == "after"


def test_a_message_whose_stored_bytes_are_no_longer_utf8_is_damage_and_its_text_is_not_quoted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes changed inside a message's text leave every page well formed, so SQLite reads on;
    Python's sqlite3 then fails to decode the text (an error with no SQLite result code that
    quotes the text). That is the file damaged, as a malformed page is: not a storage failure
    to retry, whose writes would go on into the damaged file."""
    data = tmp_path / "data"
    secret = "private-words-of-the-user"
    with _serving(data) as (_, client):
        session = client.object(DAMAGED).session()
        session.append_messages([text_message(f"m{i}", f"{secret} {i}") for i in range(5)])
        client.object(GOOD).session().append_message(text_message("g1", "fine"))
    path = object_path(data, DAMAGED)
    raw = path.read_bytes()
    at = raw.index(f"{secret} 3".encode())
    path.write_bytes(raw[:at] + b"\xff" + raw[at + 1 :])  # the page's structure is untouched
    before = _digest(path)

    with caplog.at_level(logging.INFO), _serving(data) as (_, client):
        session = client.object(DAMAGED).session()
        found = _refusal(session.get_history)
        _assert_damaged(found, data, DAMAGED)
        assert "not UTF-8" in found.message and secret not in found.message
        for call in (
            lambda: session.append_message(text_message("new", "after the damage")),
            lambda: session.get_message("m1"),
        ):
            refused = _refusal(call)
            _assert_damaged(refused, data, DAMAGED)
            assert secret not in refused.message
        assert ids(client.object(GOOD).session().get_history()) == ["g1"]
        assert _digest(path) == before
        logged = _errors_logged(caplog)
        assert len(logged) == 1, [record.getMessage() for record in logged]
        assert "not UTF-8" in logged[0].getMessage()
        assert not [record for record in caplog.records if secret in record.getMessage()]


def test_a_file_that_is_no_database_is_refused_until_erased(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    _written(data, {DAMAGED: 3})
    path = object_path(data, DAMAGED)
    with path.open("r+b") as file:
        file.write(os.urandom(4096))  # the header and the first page
    before = _digest(path)

    with caplog.at_level(logging.INFO), _serving(data) as (server, client):
        session = client.object(DAMAGED).session()
        for _ in range(3):
            refused = _refusal(session.get_history)
            _assert_damaged(refused, data, DAMAGED)
            assert "not a database" in refused.message
            _assert_damaged(_refusal(lambda: session.append_message(text_message("x"))), data, DAMAGED)
        assert _digest(path) == before
        logged = _errors_logged(caplog)
        assert len(logged) == 1 and "during open" in logged[0].getMessage()

        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            listed = stub.ListObjects(pb.ListObjectsRequest(page_size=100)).object_keys
            # A subscription too is refused, not left waiting for events that cannot come.
            feed = stub.Subscribe(pb.SubscribeRequest(object_key=DAMAGED), metadata=routing_metadata(DAMAGED))
            with pytest.raises(grpc.RpcError) as subscribed:
                next(feed)
        assert DAMAGED not in listed
        assert subscribed.value.code() == grpc.StatusCode.DATA_LOSS
        assert error_reason(subscribed.value) == "OBJECT_DAMAGED"

        assert erase_object(client, DAMAGED)
        assert not path.exists()
        assert session.get_history() == []
        assert session.append_message(text_message("m1", "afresh")).inserted
        assert ids(session.get_history()) == ["m1"]


def test_another_programs_database_at_an_objects_path_is_refused_and_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    path = object_path(data, DAMAGED)
    path.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE foo (a, b)")
        conn.execute("INSERT INTO foo VALUES (1, 2)")
        conn.commit()
    before = _digest(path)

    with caplog.at_level(logging.INFO), _serving(data) as (_, client):
        session = client.object(DAMAGED).session()
        for call in (
            session.get_history,
            lambda: session.append_message(text_message("m1")),
            lambda: session.append_message(text_message("m2")),
        ):
            refused = _refusal(call)
            _assert_damaged(refused, data, DAMAGED)
            assert "is not a Sessions object file" in refused.message
        assert _digest(path) == before
        logged = _errors_logged(caplog)
        assert len(logged) == 1 and "not a Sessions object file" in logged[0].getMessage()
    assert _digest(path) == before
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        assert [row[0] for row in conn.execute("SELECT name FROM sqlite_master")] == ["foo"]


def test_a_file_the_server_may_not_open_is_a_storage_failure_that_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the server's user may not read: SQLite says only "unable to open database file", the
    answer says it is the permissions, naming the file relative to the data directory. (Tests
    run as root, whom no mode keeps out: the path is a directory SQLite cannot open, and the OS
    is made to say the server's user may not access it.)"""
    data = tmp_path / "data"
    path = object_path(data, DAMAGED)
    path.mkdir(parents=True)
    access = os.access
    monkeypatch.setattr(rows.os, "access", lambda where, mode, **kw: where != path and access(where, mode, **kw))

    with caplog.at_level(logging.INFO), _serving(data) as (_, client):
        session = client.object(DAMAGED).session()
        for call in (session.get_history, lambda: session.append_message(text_message("m1"))):
            refused = _refusal(call)
            assert (refused.code, refused.reason) == (grpc.StatusCode.UNAVAILABLE, "STORAGE_FAILURE")
            assert "lack of permission" in refused.message
            assert _relative(data, DAMAGED) in refused.message and str(data) not in refused.message
        logged = _errors_logged(caplog)
        assert len(logged) == 1, [record.getMessage() for record in logged]
        assert logged[0].getMessage().startswith("storage failure:") and "during open" in logged[0].getMessage()
