"""`--max-concurrent-streams`: every call a client can hold open (server streams, Subscribe,
and client streams: uploads and imports) takes a slot; past the limit a call is refused with
RESOURCE_EXHAUSTED naming the limit, and a slot comes back when its call ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.service.support import error_reason

LIMIT = 2
GUARD_SECONDS = 30.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "data", limits=Limits(max_concurrent_streams=LIMIT))
    yield live
    live.stop()


def _subscribe(stub: sessions_pb2_grpc.SessionServiceStub, key: str) -> grpc.Future:
    feed = stub.Subscribe(pb.SubscribeRequest(object_key=key), metadata=routing_metadata(key), timeout=GUARD_SECONDS)
    assert next(feed).type == pb.CHANGE_TYPE_PROGRESS  # it holds its slot
    return feed


def _refused_for_slots(call: grpc.RpcError) -> bool:
    return (
        call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        and error_reason(call) == "LIMIT_EXCEEDED"
        and "max_concurrent_streams" in (call.details() or "")  # type: ignore[attr-defined]
    )


def test_uploads_held_open_take_stream_slots(server: LiveServer) -> None:
    """An upload or import that a client keeps open took no slot: 50 stalled uploads were held
    under a limit of 10."""
    release = threading.Event()

    def stalled(key: str) -> Iterator[pb.UploadMessageRequest]:
        header = pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_APPEND)
        yield pb.UploadMessageRequest(header=header, json_piece='{"id":"m","role":"user","parts":[')
        release.wait(GUARD_SECONDS)

    with grpc.insecure_channel(server.address) as channel:
        stub = sessions_pb2_grpc.SessionServiceStub(channel)
        uploads = [
            stub.UploadMessage.future(stalled(f"u{i}"), metadata=routing_metadata(f"u{i}"), timeout=GUARD_SECONDS)
            for i in range(LIMIT)
        ]
        try:
            assert wait_until(lambda: server.running.calls.calls_in_flight == LIMIT, GUARD_SECONDS)
            with pytest.raises(grpc.RpcError) as refused:
                _subscribe(stub, "feed")
            assert _refused_for_slots(refused.value), refused.value
        finally:
            release.set()
        for upload in uploads:
            with pytest.raises(grpc.RpcError):  # the message never ended: refused, and its slot freed
                upload.result()
        feed = _subscribe(stub, "feed")  # the slots came back
        feed.cancel()


def test_server_streams_past_the_limit_are_refused_and_slots_come_back(server: LiveServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = sessions_pb2_grpc.SessionServiceStub(channel)
        feeds = [_subscribe(stub, f"k{i}") for i in range(LIMIT)]
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.StreamHistory(pb.StreamHistoryRequest(object_key="k0"), metadata=routing_metadata("k0")))
        assert _refused_for_slots(refused.value), refused.value
        feeds[0].cancel()
        assert wait_until(lambda: _history_answers(stub), GUARD_SECONDS)
        feeds[1].cancel()


def _history_answers(stub: sessions_pb2_grpc.SessionServiceStub) -> bool:
    try:
        list(stub.StreamHistory(pb.StreamHistoryRequest(object_key="k0"), metadata=routing_metadata("k0")))
    except grpc.RpcError as error:
        assert _refused_for_slots(error), error
        return False
    return True
