"""A stream whose client stopped reading (alive, answering keepalives, reading nothing) waits for
room to write forever. It must not hold up the removal or replacement of its object: after a
grace the server cancels the calls still holding the object, and the delete goes through."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.domain.limits import Limits
from sessions_server.storage import registry
from sessions_server.storage.datadir import SCRATCH_DIR_NAME
from sessions_server.storage.paths import object_path
from sessions_server.transport import calls
from sessions_server.transport import servicer as servicer_module
from tests.conftest import start_server
from tests.reliability.support import wait_until
from tests.service.support import error_reason, text_message

GRACE_SECONDS = 0.3
BIG = 1_500_000


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(registry, "CLOSE_GRACE_SECONDS", GRACE_SECONDS)
    yield


def _stalled_history(session: Any, stub: sessions_pb2_grpc.SessionServiceStub, key: str) -> Any:
    """Fills the session with 30 MB (more than flow control lets ahead of a reader) and opens a
    history read of it that takes one response and then reads no more."""
    for index in range(20):
        session.append_message(text_message(f"m{index}", "x" * BIG))
    history = stub.StreamHistory(pb.StreamHistoryRequest(object_key=key), metadata=routing_metadata(key))
    next(history)
    return history


def test_a_delete_goes_through_streams_whose_clients_stopped_reading(tmp_path: Path, short_grace: None) -> None:
    server = start_server(tmp_path / "data")
    stalled = grpc.insecure_channel(server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(stalled)
    metadata = routing_metadata("wedged")
    try:
        with SessionsClient(server.address) as client:
            session = client.object("wedged").session()
            history = _stalled_history(session, stub, "wedged")
            feed = stub.Subscribe(pb.SubscribeRequest(object_key="wedged"), metadata=metadata)
            assert next(feed).type == pb.CHANGE_TYPE_PROGRESS
            for index in range(20):  # events the stalled subscriber never reads
                session.append_message(text_message(f"late{index}", "y" * BIG))

            started = time.monotonic()
            deleted = client._stub.DeleteObject(
                pb.DeleteObjectRequest(object_key="wedged", moved_to="elsewhere:1"), metadata=metadata, timeout=30
            )
            assert deleted.deleted
            assert time.monotonic() - started < 20
            assert not object_path(tmp_path / "data", "wedged").exists()

            # The stalled calls were ended by the server: reading on finds their end.
            for stream in (history, feed):
                with pytest.raises(grpc.RpcError) as ended:
                    for _ in stream:
                        pass
                assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value.details()

            other = client.object("unaffected").session()  # the server goes on serving
            other.append_message(text_message("a"))
            assert [m["id"] for m in other.get_history()] == ["a"]
    finally:
        stalled.close()
        server.stop()


def test_a_delete_whose_caller_gives_up_while_it_waits_still_removes_the_object(
    tmp_path: Path, short_grace: None
) -> None:
    """A move's DeleteObject waits (up to the grace) for calls using the object. Cancelled in
    that wait (the mover gone, a deadline), it left the file in place while the key was already
    refused and hidden from ListObjects: a second copy that a re-run of the move could not see."""
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    stalled = grpc.insecure_channel(server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(stalled)
    metadata = routing_metadata("abandoned")
    try:
        with SessionsClient(server.address) as client:
            history = _stalled_history(client.object("abandoned").session(), stub, "abandoned")  # the delete waits
            with pytest.raises(grpc.RpcError) as gave_up:
                client._stub.DeleteObject(
                    pb.DeleteObjectRequest(object_key="abandoned", moved_to="elsewhere"),
                    metadata=metadata,
                    timeout=GRACE_SECONDS / 3,
                )
            assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            path = object_path(data_dir, "abandoned")
            assert wait_until(lambda: not path.exists(), 30, interval=0.01), "the abandoned delete left the file"
            history.cancel()
    finally:
        stalled.close()
        server.stop()
    restarted = start_server(data_dir)
    try:
        with SessionsClient(restarted.address, retry=None) as client, pytest.raises(SessionsError) as refused:
            client.object("abandoned").session().get_history()
        assert refused.value.reason == "OBJECT_NOT_OWNED" and "elsewhere" in refused.value.message
        assert not object_path(data_dir, "abandoned").exists()
    finally:
        restarted.stop()


@pytest.mark.parametrize("method", ["UploadMessage", "ImportMessages"])
def test_a_message_whose_pieces_stop_coming_gives_back_what_it_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """A client that stopped sending the pieces of a message held their share of
    --max-assembly-bytes for as long as it kept the call open, and other writers were refused
    (SERVER_BUSY) meanwhile. Past the wait for the next piece the call is refused and the
    share returned."""
    monkeypatch.setattr(calls, "PIECE_IDLE_SECONDS", 0.3)
    server = start_server(tmp_path / "data")
    release = threading.Event()
    piece = "x" * 100_000

    def upload() -> Iterator[pb.UploadMessageRequest]:
        header = pb.UploadHeader(object_key="stalled", operation=pb.UPLOAD_OPERATION_APPEND)
        yield pb.UploadMessageRequest(
            header=header, json_piece='{"id":"m","role":"user","parts":[{"type":"text","text":"'
        )
        yield pb.UploadMessageRequest(json_piece=piece)
        release.wait(30)

    def import_frames() -> Iterator[pb.ImportMessagesRequest]:
        head = '{"id":"m","role":"user","parts":[{"type":"text","text":"'
        yield pb.ImportMessagesRequest(object_key="stalled", json_piece=head, more_pieces=True)
        yield pb.ImportMessagesRequest(json_piece=piece, more_pieces=True)
        release.wait(30)

    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            call = getattr(stub, method)
            with pytest.raises(grpc.RpcError) as refused:
                call(upload() if method == "UploadMessage" else import_frames(), metadata=routing_metadata("stalled"))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "piece_idle_seconds" in (refused.value.details() or "")
            assert wait_until(lambda: _held_for_pieces(server) == 0, 10), "the pieces' share was kept"
    finally:
        release.set()
        server.stop()


QUIET_GUARD_SECONDS = 20.0
QUIET_MESSAGE = '{"id":"m","role":"user","parts":[{"type":"text","text":"hi"}]}'


@pytest.mark.parametrize(
    ("method", "sent"),
    [
        ("ImportMessages", "a whole message"),
        ("ImportMessages", "a message in one piece"),
        ("ImportMessages", "no frame"),
        ("UploadMessage", "no frame"),
        ("ImportObject", "no frame"),
        ("ImportObject", "part of a file"),
    ],
)
def test_a_client_stream_that_goes_quiet_between_messages_is_refused_and_frees_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, sent: str
) -> None:
    """Only the wait for a message's next piece was bounded: an import that went quiet after a
    message (or before its first frame), an upload before its first frame, and an object's
    import before or within its file, were kept open
    as long as the client kept the call, each holding a stream slot (an import its object's
    store too), so that a few of them refused every other stream call of the server. Past
    the same idle limit they are refused the same way, the slot comes back, and the messages
    the import received are kept."""
    monkeypatch.setattr(calls, "PIECE_IDLE_SECONDS", 0.3)
    monkeypatch.setattr(calls, "REFUSED_STREAM_DRAIN_SECONDS", 1.0)  # the client sends no more
    server = start_server(tmp_path / "data", limits=Limits(max_concurrent_streams=1))
    release = threading.Event()

    def frames() -> Iterator[Any]:
        if sent == "a whole message":
            yield pb.ImportMessagesRequest(object_key="quiet", messages=[pb.ImportedMessage(json=QUIET_MESSAGE)])
        elif sent == "a message in one piece":
            yield pb.ImportMessagesRequest(object_key="quiet", json_piece=QUIET_MESSAGE)
        elif sent == "part of a file":
            yield pb.ImportObjectRequest(object_key="quiet", data=b"SQLite format 3\x00" + bytes(4080))
        release.wait(2 * QUIET_GUARD_SECONDS)  # alive, not half-closed (past the call's deadline), sending nothing

    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            call = getattr(stub, method).future(
                frames(), metadata=routing_metadata("quiet"), timeout=QUIET_GUARD_SECONDS
            )
            with pytest.raises(grpc.RpcError) as refused:
                call.result()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
            assert error_reason(refused.value) == "LIMIT_EXCEEDED"
            assert "piece_idle_seconds" in (refused.value.details() or "")
        # The only stream slot came back (a read is a stream call), and the import kept what it took.
        with SessionsClient(server.address, retry=None) as client:
            history = client.object("quiet").session().get_history()
        assert [message["id"] for message in history] == (
            ["m"] if method == "ImportMessages" and sent != "no frame" else []
        )
        assert not list((tmp_path / "data" / SCRATCH_DIR_NAME).glob("*")), "a received file was left behind"
    finally:
        release.set()
        server.stop()


def _held_for_pieces(server: Any) -> float:
    value = server.running.metrics.registry.get_sample_value("sessions_assembly_bytes")
    return float(value or 0.0)


@pytest.mark.parametrize("taken", [1, 0], ids=["after-a-frame", "before-any"])
def test_an_export_whose_client_stopped_reading_is_ended_and_its_copy_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: int
) -> None:
    """An export holds a copy of its object in scratch until its last frame is taken: a client
    that stopped reading kept it there for as long as its connection lived. The refusal waits
    behind the frame not taken, and the call keeps its stream slot until its client reads it
    (a first frame never taken left the client with no end at all)."""
    monkeypatch.setattr(servicer_module, "EXPORT_IDLE_SECONDS", 0.5)
    data_dir = tmp_path / "data"
    scratch = data_dir / SCRATCH_DIR_NAME
    server = start_server(data_dir, limits=Limits(max_concurrent_streams=1))
    # A window that does not grow: flow control lets only a little ahead of this reader.
    stalled = grpc.insecure_channel(server.address, options=[("grpc.http2.bdp_probe", 0)])
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("exported").session()
            for index in range(8):  # 12 MB: frames beyond what flow control lets ahead
                session.append_message(text_message(f"m{index}", "x" * BIG))
            stub = sessions_pb2_grpc.SessionServiceStub(stalled)
            request = pb.ExportObjectRequest(object_key="exported")
            export = stub.ExportObject(request, metadata=routing_metadata("exported"), timeout=60)
            for _ in range(taken):
                assert next(export).size_bytes > 0
            assert wait_until(lambda: bool(_files_in(scratch)), 10, interval=0.01)  # the copy
            assert wait_until(lambda: not _files_in(scratch), 10, interval=0.01), "the copy stayed"
            with pytest.raises(SessionsError) as busy:  # the stalled call still holds the one slot
                session.get_history()
            assert busy.value.metadata.get("limit") == "max_concurrent_streams"
            with pytest.raises(grpc.RpcError) as ended:
                for _ in export:
                    pass
            assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(ended.value) == "LIMIT_EXCEEDED"
            assert "not taken in time" in (ended.value.details() or "")
            # The slot is free again; the object is whole and exports to a reader that keeps up.
            assert wait_until(lambda: _streams_again(session), 10, interval=0.01)
            frames = list(stub.ExportObject(request, metadata=routing_metadata("exported"), timeout=60))
            assert frames[-1].sha256
    finally:
        stalled.close()
        server.stop()


def _streams_again(session: Any) -> bool:
    try:
        return len(session.get_history()) == 8
    except SessionsError as busy:
        assert busy.metadata.get("limit") == "max_concurrent_streams"
        return False


def _files_in(directory: Path) -> list[Path]:
    return list(directory.iterdir()) if directory.exists() else []
