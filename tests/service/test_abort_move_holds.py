"""AbortMove tells a move's source lock from its destination's hold. An operator recovering from a
mover killed before its delete ran `abort-move` on both servers, as its help describes, and both
answered "released ... it takes writes again": the destination's copy and the source then took
writes side by side and diverged. Releasing a destination's hold is now asked for by name
(`release_hold`, `abort-move --release-hold`); `abort_move` leaves one alone and says why."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_client.admin import abort_move, release_hold
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import start_server
from tests.service.support import exported, text_message

KEY = "arriving"


def _held_copy(stub: pb_grpc.SessionServiceStub, client: SessionsClient) -> None:
    """KEY installed here as a move's destination holds it (ImportObject with hold_for_move)."""
    client.object("source").session().append_message(text_message("m1", "the source's"))
    data = b"".join(frame.data for frame in exported(stub, "source"))
    frames = [
        pb.ImportObjectRequest(object_key=KEY, hold_for_move=True, data=data),
        pb.ImportObjectRequest(sha256=hashlib.sha256(data).hexdigest()),
    ]
    assert stub.ImportObject(iter(frames), metadata=routing_metadata(KEY)).move_id


def _refused_write(client: SessionsClient) -> SessionsError:
    with pytest.raises(SessionsError) as refused:
        client.object(KEY).session().append_message(text_message("w", "a write"))
    return refused.value


def test_abort_move_leaves_a_destinations_hold_and_says_what_it_is(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            _held_copy(stub, client)
            moving = _refused_write(client)
            assert (moving.code, moving.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")
            assert "arriving by a move" in moving.message

            with pytest.raises(SessionsError) as refused:
                abort_move(client, KEY)
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "holds the copy a move brought here" in refused.value.message
            assert "--release-hold" in refused.value.message
            assert _refused_write(client).reason == "OBJECT_MOVING"  # still held: nothing released

            only_locks = pb.AbortMoveRequest(object_key=KEY, source_lock_only=True)
            with pytest.raises(grpc.RpcError) as raw:
                stub.AbortMove(only_locks, metadata=routing_metadata(KEY))
            assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION

            assert release_hold(client, KEY)
            assert client.object(KEY).session().append_message(text_message("w", "a write")).inserted
            assert not release_hold(client, KEY)  # nothing left to release
    finally:
        server.stop()


def test_abort_move_says_which_it_released(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            _held_copy(stub, client)
            released = stub.AbortMove(pb.AbortMoveRequest(object_key=KEY), metadata=routing_metadata(KEY))
            assert (released.was_locked, released.was_arrival_hold) == (True, True)

            exported(stub, "source", lock_for_move=True)
            only_locks = pb.AbortMoveRequest(object_key="source", source_lock_only=True)
            released = stub.AbortMove(only_locks, metadata=routing_metadata("source"))
            assert (released.was_locked, released.was_arrival_hold) == (True, False)
            assert client.object("source").session().append_message(text_message("m2", "writable")).inserted
    finally:
        server.stop()
