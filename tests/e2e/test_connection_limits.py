"""What one client connection may hold (--max-streams-per-connection) and how long it stays
without a call (--max-connection-idle-seconds). Unbounded, one connection opening and resetting
streams as fast as it could (CVE-2023-44487) took the server to 870 MB and other clients' calls
were cancelled, and connections that only answered pings were kept for good (an HTTP/2 audit,
session 48)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.e2e.conftest import ServerProcess

WAIT_SECONDS = 30.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path / "data",
        "--max-streams-per-connection",
        "3",
        "--max-connection-idle-seconds",
        "0.5",
        "--progress-seconds",
        "0.2",
    ).start()
    yield process
    process.stop()


def _stats(stub: pb_grpc.SessionServiceStub, timeout: float) -> pb.GetObjectStatsResponse:
    return stub.GetObjectStats(pb.GetObjectStatsRequest(object_key="k"), timeout=timeout)


def test_a_connection_holds_its_streams_and_its_next_call_waits_for_one_to_end(server: ServerProcess) -> None:
    separate = [("grpc.use_local_subchannel_pool", 1)]  # else both channels share one connection
    with grpc.insecure_channel(server.address) as busy, grpc.insecure_channel(server.address, separate) as other:
        stub = pb_grpc.SessionServiceStub(busy)
        feeds = [stub.Subscribe(pb.SubscribeRequest(object_key="k")) for _ in range(3)]
        for feed in feeds:
            assert next(feed).type == pb.CHANGE_TYPE_PROGRESS  # open: the server answered it
        with pytest.raises(grpc.RpcError) as waited:
            _stats(stub, timeout=1.0)  # a fourth stream on the connection: no slot until one ends
        assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert _stats(pb_grpc.SessionServiceStub(other), timeout=WAIT_SECONDS).file_bytes == 0  # others are served

        feeds[0].cancel()
        assert _stats(stub, timeout=WAIT_SECONDS).file_bytes == 0
        for feed in feeds[1:]:
            feed.cancel()


def _states(channel: grpc.Channel) -> tuple[list[grpc.ChannelConnectivity], threading.Condition]:
    seen: list[grpc.ChannelConnectivity] = []
    changed = threading.Condition()

    def note(state: grpc.ChannelConnectivity) -> None:
        with changed:
            seen.append(state)
            changed.notify_all()

    channel.subscribe(note, try_to_connect=False)
    return seen, changed


def test_a_connection_without_calls_is_closed_and_the_client_reconnects_at_its_next(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        seen, changed = _states(channel)
        _stats(stub, timeout=WAIT_SECONDS)
        with changed:  # the server's GOAWAY once the connection went 0.5 s without a call
            assert changed.wait_for(
                lambda: grpc.ChannelConnectivity.READY in seen and seen[-1] == grpc.ChannelConnectivity.IDLE,
                timeout=WAIT_SECONDS,
            ), seen
        assert _stats(stub, timeout=WAIT_SECONDS).file_bytes == 0


def test_a_connection_with_a_stream_open_is_not_idle(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        seen, changed = _states(channel)
        feed = stub.Subscribe(pb.SubscribeRequest(object_key="k"))
        progress = [next(feed) for _ in range(10)]  # an event every 0.2 s: 2 s, four idle limits
        assert all(event.type == pb.CHANGE_TYPE_PROGRESS for event in progress)
        with changed:  # the state callbacks run on gRPC's own thread
            assert changed.wait_for(lambda: grpc.ChannelConnectivity.READY in seen, timeout=WAIT_SECONDS), seen
            assert grpc.ChannelConnectivity.IDLE not in seen[seen.index(grpc.ChannelConnectivity.READY) :], seen
        feed.cancel()
