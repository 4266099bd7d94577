"""A move's lock or hold that the disk would not record (DEPARTING, ARRIVING): the call that
needed it is answered as a storage failure, and nothing of it is left to come back. The export
answered INTERNAL, and the lock it failed to write was written with the next move of another
object: a restart then refused writes to an object that had never moved, for the lease."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.move_holds import DEPARTING_FILE_NAME
from tests.conftest import start_server
from tests.service.support import exported, text_message


def test_a_move_lock_the_disk_refused_is_a_storage_failure_and_never_comes_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            for key in ("failed", "moved"):
                client.object(key).session().append_message(text_message("m0"))
            staged = data / (DEPARTING_FILE_NAME + ".new")
            staged.mkdir()  # where DEPARTING is staged: its write fails, as on a full or failing disk
            with pytest.raises(grpc.RpcError) as refused:
                exported(stub, "failed", lock_for_move=True)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
            assert "recording the move lock failed" in (refused.value.details() or "")
            assert str(data) not in (refused.value.details() or "")
            assert client.object("failed").session().append_message(text_message("m1")).inserted
            staged.rmdir()
            frames = exported(stub, "moved", lock_for_move=True)  # another object's move writes DEPARTING
            request = pb.DeleteObjectRequest(object_key="moved", moved_to="elsewhere:1", move_id=frames[-1].move_id)
            assert stub.DeleteObject(request, metadata=routing_metadata("moved")).deleted
    finally:
        server.stop()
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client:
            assert client.object("failed").session().append_message(text_message("m2")).inserted
            assert [m["id"] for m in client.object("failed").session().get_history()] == ["m0", "m1", "m2"]
    finally:
        server.stop()
