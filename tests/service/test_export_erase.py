"""An erase ends the exports of its object under way: an import audit saw an export begun before
an erase go on sending the whole erased object after the erase returned (206 MB, a valid
digest), a copy of data the caller had asked to delete for good."""

from __future__ import annotations

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_client.admin import erase_object
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import LiveServer
from tests.service.support import text_message

KEY = "erased-while-exported"


def test_an_erase_ends_an_export_under_way(live_server: LiveServer) -> None:
    with SessionsClient(live_server.address) as client, grpc.insecure_channel(live_server.address) as channel:
        session = client.object(KEY).session()
        for index in range(40):  # about 40 MB: frames of 3 MiB, more than the transport buffers
            session.append_message(text_message(f"m{index}", f"{index} " + "x" * 1_000_000))
        stub = pb_grpc.SessionServiceStub(channel)
        frames = stub.ExportObject(pb.ExportObjectRequest(object_key=KEY), metadata=routing_metadata(KEY))
        first = next(frames)
        assert first.size_bytes > 30_000_000 and first.data

        assert erase_object(client, KEY)
        received = len(first.data)
        with pytest.raises(grpc.RpcError) as ended:
            for frame in frames:
                received += len(frame.data)
                assert not frame.sha256, "the whole erased object was sent"
        assert ended.value.code() == grpc.StatusCode.NOT_FOUND
        assert "erased while it was being exported" in (ended.value.details() or "")
        assert received < first.size_bytes
        assert session.get_history() == []
