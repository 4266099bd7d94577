"""A cancelled or expired stream releases everything at once: its hold on the object, its reads."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from tests.conftest import start_server


def _wait_until(condition, seconds: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.mark.parametrize("newest_first", [False, True])
def test_cancelled_history_stream_releases_the_object(tmp_path: Path, newest_first: bool) -> None:
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            session = client.object("cancel").session()
            session.append_messages(
                [{"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": "x" * 20_000}]} for i in range(400)]
            )
            channel = grpc.insecure_channel(server.address)
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            call = stub.StreamHistory(
                pb.StreamHistoryRequest(object_key="cancel", newest_first=newest_first),
                metadata=routing_metadata("cancel"),
            )
            next(call)
            store = server.running.registry._open["cancel"]
            assert store.users >= 1
            call.cancel()
            assert _wait_until(lambda: store.users == 0), "the cancelled stream still holds the object"
            channel.close()
            # The object still serves, and its readers were returned to the pool (no leak).
            assert len(session.get_history()) == 400
    finally:
        server.stop()


def test_deadline_ends_a_stream_with_deadline_exceeded_and_releases(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            obj = client.object("deadline")
            obj.session().append_message({"id": "m1", "role": "user", "parts": []})
            # The clients give subscriptions no deadline; a caller of the stub may.
            stream = client._stub.Subscribe(
                pb.SubscribeRequest(object_key="deadline"), metadata=routing_metadata("deadline"), timeout=0.5
            )
            with pytest.raises(grpc.RpcError) as info:
                for _ in stream:
                    pass
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            store = server.running.registry._open["deadline"]
            assert _wait_until(lambda: store.users == 0 and store.feed.subscriber_count == 0)
    finally:
        server.stop()
