"""`DeleteObject` with `erase`: an object removed for good (a user's data deleted), where the plain
delete, the last step of a move, leaves the key refused. Nothing is recorded: the key's next write
creates a new, empty object, restarts included."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_client.admin import erase_object
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.paths import object_path
from tests.conftest import start_server
from tests.service.support import text_message


@contextlib.contextmanager
def _connected(address: str) -> Iterator[tuple[SessionsClient, pb_grpc.SessionServiceStub]]:
    """The Python client and a raw stub on one server."""
    with SessionsClient(address) as client, grpc.insecure_channel(address) as channel:
        yield client, pb_grpc.SessionServiceStub(channel)


def _listed(stub: pb_grpc.SessionServiceStub) -> list[str]:
    return list(stub.ListObjects(pb.ListObjectsRequest(page_size=1000)).object_keys)


def test_an_erased_object_is_gone_and_its_key_starts_afresh(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with _connected(server.address) as (client, stub):
            obj = client.object("user-1")
            obj.session().append_message(text_message("m1", "private words"))
            obj.session("other").append_message(text_message("m2", "more private words"))
            assert [hit.id for hit in obj.session().search("private")] == ["m1"]  # the index exists
            client.object("kept").session().append_message(text_message("k1"))

            feed_ended: queue.Queue[BaseException | None] = queue.Queue()
            subscription = obj.subscribe(include_progress=True, reconnect_attempts=0)
            assert next(subscription).type == "progress"

            def follow() -> None:
                try:
                    for _ in subscription:
                        pass
                    feed_ended.put(None)
                except BaseException as exc:  # the end of the feed, reported to the test
                    feed_ended.put(exc)

            threading.Thread(target=follow, daemon=True).start()

            assert erase_object(client, "user-1") is True
            assert isinstance(feed_ended.get(timeout=30), SessionsError)  # its subscription ended
            assert not object_path(data, "user-1").exists()
            assert _listed(stub) == ["kept"]
            assert obj.session().get_history() == []
            assert obj.session("other").get_history() == []

            assert erase_object(client, "user-1") is False  # nothing left to remove
            obj.session().append_message(text_message("n1", "a new start"))
            assert [m["id"] for m in obj.session().get_history()] == ["n1"]
            assert obj.list_sessions() == [("", 1)]
            assert obj.session().search("private") == []
            assert client.object("kept").session().get_history() == [text_message("k1")]
        server.stop()

        server = start_server(data)  # nothing recorded: the new object is served after a restart
        with SessionsClient(server.address) as client:
            assert erase_object(client, "user-1") is True
            client.object("user-1").session().append_message(text_message("n2"))
            assert [m["id"] for m in client.object("user-1").session().get_history()] == ["n2"]
    finally:
        server.stop()


def test_an_erase_that_names_a_destination_or_meets_a_move_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with _connected(server.address) as (client, stub):
            for key in ("kept", "moving", "gone"):
                client.object(key).session().append_message(text_message("m1"))

            with pytest.raises(grpc.RpcError) as named:
                stub.DeleteObject(
                    pb.DeleteObjectRequest(object_key="kept", moved_to="elsewhere:1", erase=True),
                    metadata=routing_metadata("kept"),
                )
            assert named.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "moved_to" in (named.value.details() or "")
            assert client.object("kept").session().get_history() == [text_message("m1")]

            export = stub.ExportObject(
                pb.ExportObjectRequest(object_key="moving", lock_for_move=True), metadata=routing_metadata("moving")
            )
            assert b"".join(frame.data for frame in export).startswith(b"SQLite format 3")
            with pytest.raises(SessionsError) as moving:
                erase_object(client, "moving")
            assert (moving.value.code, moving.value.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")
            assert object_path(data, "moving").exists()

            stub.DeleteObject(
                pb.DeleteObjectRequest(object_key="gone", moved_to="elsewhere:1"), metadata=routing_metadata("gone")
            )
            with pytest.raises(SessionsError) as moved:
                erase_object(client, "gone")
            assert (moved.value.code, moved.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_NOT_OWNED")
            assert "elsewhere:1" in moved.value.message
    finally:
        server.stop()


def test_a_plain_delete_that_would_only_block_the_key_is_refused_and_records_nothing(tmp_path: Path) -> None:
    """A plain delete records the key as moved away, refused from then on (restarts included)
    until an import. One of a key never stored here, or of a live object with neither a move
    lock nor a destination (an erase without `erase`), left a key that no call could use."""
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with _connected(server.address) as (client, stub):
            client.object("live").session().append_message(text_message("m1"))
            for key, code in (
                ("never-written", grpc.StatusCode.NOT_FOUND),
                ("live", grpc.StatusCode.FAILED_PRECONDITION),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.DeleteObject(pb.DeleteObjectRequest(object_key=key), metadata=routing_metadata(key))
                assert refused.value.code() == code, refused.value.details()
            assert "erase" in (refused.value.details() or "")
            client.object("never-written").session().append_message(text_message("n1"))  # not refused
            assert client.object("live").session().get_history() == [text_message("m1")]
            assert not (data / "MOVED").exists()

            # A move's delete, and its repeat (its answer lost, say), go through.
            request = pb.DeleteObjectRequest(object_key="live", moved_to="elsewhere:1")
            assert stub.DeleteObject(request, metadata=routing_metadata("live")).deleted
            assert not stub.DeleteObject(request, metadata=routing_metadata("live")).deleted
            with pytest.raises(SessionsError) as moved:
                client.object("live").session().get_history()
            assert moved.value.reason == "OBJECT_NOT_OWNED"
    finally:
        server.stop()
