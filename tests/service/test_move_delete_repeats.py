"""A move's delete asked again, its answer lost, is answered `deleted=false` and changes nothing.
Every delete of a key already moved away was taken as such a repeat: one naming another move's
lock, or another destination, rewrote where the key went, restarts included. A mover that
stalled while an operator released its lock and moved the object again thus took the object as
moved to its own stale copy, and the source sent every caller there."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import start_server
from tests.service.support import exported, text_message

KEY = "moving"


def _locked_export(stub: pb_grpc.SessionServiceStub) -> str:
    """Exports KEY with a move's lock; the lock's id."""
    return str(exported(stub, KEY, lock_for_move=True)[-1].move_id)


def _owner(client: SessionsClient) -> str:
    """Where the server says KEY went."""
    with pytest.raises(SessionsError) as refused:
        client.object(KEY).session().get_history()
    assert refused.value.reason == "OBJECT_NOT_OWNED", refused.value
    return str(refused.value.metadata.get("owner"))


def _delete(stub: pb_grpc.SessionServiceStub, moved_to: str, move_id: str) -> pb.DeleteObjectResponse:
    request = pb.DeleteObjectRequest(object_key=KEY, moved_to=moved_to, move_id=move_id)
    return stub.DeleteObject(request, metadata=routing_metadata(KEY))


def test_a_stale_movers_delete_after_another_move_ended_is_refused_and_records_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            client.object(KEY).session().append_message(text_message("m1"))
            stalled = _locked_export(stub)  # the first mover, which then stalls
            stub.AbortMove(pb.AbortMoveRequest(object_key=KEY), metadata=routing_metadata(KEY))
            client.object(KEY).session().append_message(text_message("m2"))  # not in the stale copy
            current = _locked_export(stub)  # the move run again, to another server
            assert _delete(stub, "second:2", current).deleted
            journal = (data / "MOVED").read_bytes()

            # The stalled mover's delete, as it would send it, and the variants of it.
            for moved_to, move_id in (
                ("first:1", stalled),
                ("second:2", stalled),
                ("first:1", ""),
                ("first:1", current),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    _delete(stub, moved_to, move_id)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, (moved_to, move_id)
                assert "second:2" in (refused.value.details() or ""), refused.value.details()
                assert _owner(client) == "second:2"
            assert (data / "MOVED").read_bytes() == journal

            # The ending move's own repeat, and one naming nothing, are answered, recording nothing.
            assert not _delete(stub, "second:2", current).deleted
            assert not _delete(stub, "", "").deleted
            assert _owner(client) == "second:2"
            assert (data / "MOVED").read_bytes() == journal
    finally:
        server.stop()

    server = start_server(data)  # the lock the delete ended is recorded with it
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                _delete(stub, "second:2", stalled)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert not _delete(stub, "second:2", current).deleted
            assert _owner(client) == "second:2"
    finally:
        server.stop()


def test_a_move_back_that_failed_keeps_the_lock_the_first_delete_ended(tmp_path: Path) -> None:
    """An import bringing the object back that failed (its copy dropped) refuses the key again
    as before: it recorded the move once more, but without the lock its delete had ended, and
    a delete naming any lock passed for a repeat."""
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            client.object(KEY).session().append_message(text_message("m1"))
            frames = exported(stub, KEY, lock_for_move=True)
            ended = frames[-1].move_id
            assert _delete(stub, "b:1", ended).deleted
            data = b"".join(frame.data for frame in frames)
            back = [
                pb.ImportObjectRequest(object_key=KEY, hold_for_move=True, data=data),
                pb.ImportObjectRequest(sha256=hashlib.sha256(data).hexdigest()),
            ]
            hold = stub.ImportObject(iter(back), metadata=routing_metadata(KEY)).move_id
            dropped = pb.DeleteObjectRequest(object_key=KEY, erase=True, move_id=hold)
            assert stub.DeleteObject(dropped, metadata=routing_metadata(KEY)).deleted
            assert _owner(client) == "b:1"

            with pytest.raises(grpc.RpcError) as refused:
                _delete(stub, "b:1", "another-lock")
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert not _delete(stub, "b:1", ended).deleted
    finally:
        server.stop()
