"""An export streams a copy of its object's file, made in scratch. Exports of one object that
begin while it stays unchanged share one copy (each made its own: 10 exports of a 219 MB object
took 2.1 GB of scratch in 1.9 s); a write in between makes the next export copy it again, and
the last export done with a copy removes it."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import RetryNotice, SessionsClient
from sessions_client._common import routing_metadata
from sessions_client.admin import export_file, import_file, move_object
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.storage import files
from sessions_server.storage.datadir import SCRATCH_DIR_NAME
from tests.conftest import start_server
from tests.reliability.support import wait_until
from tests.service.support import error_reason, text_message

KEY = "exported"
BIG = 1_500_000  # 8 of them: more frames than flow control lets ahead of a reader


def _export(stub: sessions_pb2_grpc.SessionServiceStub) -> Iterator[Any]:
    request = pb.ExportObjectRequest(object_key=KEY)
    return iter(stub.ExportObject(request, metadata=routing_metadata(KEY), timeout=60))


def _rest(first: Any, export: Iterator[Any]) -> tuple[bytes, str]:
    """The file an export sent, and the digest its last frame names."""
    frames = [first, *export]
    data = b"".join(frame.data for frame in frames)
    assert len(data) == first.size_bytes
    return data, frames[-1].sha256


def _copies(data_dir: Path) -> list[Path]:
    scratch = data_dir / SCRATCH_DIR_NAME
    return list(scratch.iterdir()) if scratch.exists() else []


def _reader_channels(address: str, count: int) -> list[grpc.Channel]:
    """Channels whose flow-control window does not grow: a reader that stops stalls its export."""
    return [grpc.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0)]) for _ in range(count)]


def _fill(session: Any) -> None:
    for index in range(8):
        session.append_message(text_message(f"m{index}", "x" * BIG))


def _message_ids(path: Path, data: bytes) -> list[str]:
    path.write_bytes(data)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM cf_agents_session_messages ORDER BY created_at, id")]


def test_exports_of_an_unchanged_object_share_one_copy(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    channels = _reader_channels(server.address, 4)
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object(KEY).session()
            _fill(session)
            stubs = [sessions_pb2_grpc.SessionServiceStub(channel) for channel in channels]

            before = [_export(stub) for stub in stubs[:3]]
            firsts = [next(export) for export in before]  # each has its copy by its first frame
            assert len(_copies(data_dir)) == 1

            session.append_message(text_message("m8", "after the first exports"))
            after = _export(stubs[3])
            after_first = next(after)
            assert len(_copies(data_dir)) == 2  # the object changed: a copy of its own

            sent = [_rest(first, export) for first, export in zip(firsts, before, strict=True)]
            assert len(_copies(data_dir)) == 1  # the last export done with the first copy removed it
            later, later_digest = _rest(after_first, after)
            assert _copies(data_dir) == []

            for data, digest in [*sent, (later, later_digest)]:
                assert hashlib.sha256(data).hexdigest() == digest
            assert {digest for _, digest in sent} == {sent[0][1]} != {later_digest}

            # Each sent file is the object as its export began: the first three without m8.
            for data, count in [(sent[0][0], 8), (later, 9)]:
                assert _message_ids(tmp_path / "sent.db", data) == [f"m{index}" for index in range(count)]
    finally:
        for channel in channels:
            channel.close()
        server.stop()


class _HeldCopies:
    """Four exports, each begun after a write, that have taken one frame and hold their copy."""

    def __init__(self, address: str, session: Any) -> None:
        self.channels = _reader_channels(address, 4)
        self.held = []
        for index, channel in enumerate(self.channels):
            session.append_message(text_message(f"w{index}", "a write between exports"))
            export = _export(sessions_pb2_grpc.SessionServiceStub(channel))
            self.held.append((next(export), export))

    def finish_one(self) -> None:
        data, digest = _rest(*self.held.pop(0))
        assert hashlib.sha256(data).hexdigest() == digest

    def close(self) -> None:
        while self.held:
            self.finish_one()
        for channel in self.channels:
            channel.close()


@contextlib.contextmanager
def _four_copies_held(address: str, session: Any, data_dir: Path) -> Iterator[_HeldCopies]:
    """The object filled, four exports each begun after a write and holding their copy, then
    one more write ("w4"); on leaving, every export ends whole and scratch is left empty."""
    _fill(session)
    held = _HeldCopies(address, session)
    try:
        session.append_message(text_message("w4", "one more write"))
        yield held
    finally:
        held.close()
    assert _copies(data_dir) == []


def test_exports_between_writes_hold_at_most_four_copies_of_an_object(tmp_path: Path) -> None:
    """Each export that begins after a write needs a copy of its own: a fifth such copy, while
    four are held, is refused as busy, which clients retry, until one of them is done."""
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    (fifth,) = _reader_channels(server.address, 1)
    try:
        with (
            SessionsClient(server.address, retry=None) as client,
            _four_copies_held(server.address, client.object(KEY).session(), data_dir) as held,
        ):
            assert len(_copies(data_dir)) == 4
            stub = sessions_pb2_grpc.SessionServiceStub(fifth)
            with pytest.raises(grpc.RpcError) as refused:
                next(_export(stub))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(refused.value) == "SERVER_BUSY"
            assert "max_export_copies_per_object" in (refused.value.details() or "")
            assert len(_copies(data_dir)) == 4

            held.finish_one()
            export = _export(stub)  # one copy fewer: the fifth is made
            data, digest = _rest(next(export), export)
            assert hashlib.sha256(data).hexdigest() == digest
            assert _message_ids(tmp_path / "fifth.db", data)[-1] == "w4"
    finally:
        fifth.close()
        server.stop()


def test_export_file_tries_again_while_the_copies_are_taken(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    try:
        with (
            SessionsClient(server.address, retry=None) as client,
            _four_copies_held(server.address, client.object(KEY).session(), data_dir) as held,
        ):
            notices: list[RetryNotice] = []

            def one_ends(notice: RetryNotice) -> None:
                notices.append(notice)
                held.finish_one()  # while the client waits to try again

            with SessionsClient(server.address, on_retry=one_ends) as retrying:
                report = export_file(retrying, KEY, tmp_path / "saved.db")
            assert [(n.method, n.error.reason) for n in notices] == [("ExportObject", "SERVER_BUSY")]
            assert report.message_rows == 13
            ids = _message_ids(tmp_path / "check.db", (tmp_path / "saved.db").read_bytes())
            assert ids[-1] == "w4"
    finally:
        server.stop()


def test_a_move_is_not_refused_for_the_copies_exports_hold(tmp_path: Path) -> None:
    source, destination = start_server(tmp_path / "a"), start_server(tmp_path / "b")
    try:
        with (
            SessionsClient(source.address, retry=None) as a,
            SessionsClient(destination.address) as b,
            # Leaving it, the exports under way end whole and scratch is left empty.
            _four_copies_held(source.address, a.object(KEY).session(), tmp_path / "a"),
        ):
            report = move_object(a, b, KEY, destination_name=destination.address)
            assert report.message_rows == 13
            assert [m["id"] for m in b.object(KEY).session().get_history()][-1] == "w4"
    finally:
        source.stop()
        destination.stop()


def test_an_export_cancelled_while_its_copy_is_made_leaves_it_to_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy is made once for both exports; the first one's caller leaving while it is being
    made neither stops it for the second nor leaves it behind once the second is done."""
    data_dir = tmp_path / "data"
    entered, release = threading.Event(), threading.Event()
    made: list[Path] = []
    real = files.snapshot_object

    def held_snapshot(source: Path, scratch_dir: Path, row_writes: int) -> Path:
        entered.set()
        assert release.wait(timeout=60), "the copy was never released"
        made.append(real(source, scratch_dir, row_writes))
        return made[-1]

    monkeypatch.setattr(files, "snapshot_object", held_snapshot)
    server = start_server(data_dir)
    channels = _reader_channels(server.address, 2)
    try:
        with SessionsClient(server.address, retry=None) as client:
            _fill(client.object(KEY).session())
            first_stub, second_stub = (sessions_pb2_grpc.SessionServiceStub(channel) for channel in channels)
            request = pb.ExportObjectRequest(object_key=KEY)
            first = first_stub.ExportObject(request, metadata=routing_metadata(KEY), timeout=60)
            assert entered.wait(timeout=60)
            second = _export(second_stub)
            admin = server.running.service.objects
            assert wait_until(lambda: KEY in admin._copies and admin._copies[KEY].users == 2, 60, interval=0.001)
            taken: list[Any] = []
            reader = threading.Thread(target=lambda: taken.append(next(second)))
            reader.start()
            first.cancel()
            release.set()
            reader.join(timeout=60)
            data, digest = _rest(taken[0], second)
            assert hashlib.sha256(data).hexdigest() == digest
            assert _message_ids(tmp_path / "second.db", data) == [f"m{index}" for index in range(8)]
            assert len(made) == 1  # one copy for both
            with pytest.raises(grpc.RpcError) as cancelled:
                next(first)
            assert cancelled.value.code() == grpc.StatusCode.CANCELLED
        assert _copies(data_dir) == []
    finally:
        release.set()
        for channel in channels:
            channel.close()
        server.stop()


def test_a_copy_of_an_open_object_carries_its_count_of_rows_written(tmp_path: Path) -> None:
    """The store keeps its object's count of rows written in memory and saves it as it closes:
    an export, a move or a vacuum of an object still open copied the count last saved (none,
    for an object never closed), and the copy started again from 0."""
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client:
            source = client.object(KEY)
            source.session().append_messages([text_message(f"m{i}", "counted") for i in range(5)])
            written = source.get_object_stats().row_writes
            assert written >= 5
            export_file(client, KEY, tmp_path / "copy.sqlite")
            import_file(client, "imported", tmp_path / "copy.sqlite")
            assert client.object("imported").get_object_stats().row_writes == written
            source.vacuum()
            assert source.get_object_stats().row_writes == written
    finally:
        server.stop()
    server = start_server(tmp_path / "data")  # the vacuumed file, its count saved at the stop
    try:
        with SessionsClient(server.address, retry=None) as client:
            assert client.object(KEY).get_object_stats().row_writes == written
    finally:
        server.stop()
