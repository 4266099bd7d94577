"""Connection keepalive: a client that vanishes without closing its connection releases what its
calls held once the server's pings go unanswered, and clients' own keepalive pings are welcome."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError, aio
from sessions_client._common import channel_options
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.e2e.conftest import ServerProcess
from tests.relay import Relay

DEADLINE_SECONDS = 30.0


class Blackhole(Relay):
    """A TCP relay to a server that, once `vanish()` is called, stops moving bytes both ways
    while keeping both connections open: a client whose host or network went away."""

    def __init__(self, target: str) -> None:
        self._vanished = threading.Event()
        super().__init__(target)

    def vanish(self) -> None:
        self._vanished.set()

    def pump(self, source: socket.socket, sink: socket.socket, *, from_server: bool) -> None:
        while not self._vanished.is_set():
            try:
                data = source.recv(65536)
                if not data or self._vanished.is_set():
                    return  # a vanished peer reads nothing more and answers nothing
                sink.sendall(data)
            except OSError:
                return


@pytest.fixture
def watchful_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path / "data",
        "--max-subscribers-per-object",
        "1",
        "--keepalive-seconds",
        "0.5",
        "--keepalive-timeout-seconds",
        "0.5",
    ).start()
    yield server
    server.stop()


def _subscribe(channel: grpc.Channel) -> Iterator[pb.SubscribeResponse]:
    return pb_grpc.SessionServiceStub(channel).Subscribe(pb.SubscribeRequest(object_key="watched"))


def test_a_vanished_subscribers_slot_is_freed_when_its_pings_go_unanswered(watchful_server: ServerProcess) -> None:
    relay = Blackhole(watchful_server.address)
    far = grpc.insecure_channel(relay.address)
    near = grpc.insecure_channel(watchful_server.address)
    try:
        held = _subscribe(far)  # referenced to the end: a dropped iterator cancels its call
        assert next(held).type == pb.CHANGE_TYPE_PROGRESS  # admitted: the object's one slot
        with pytest.raises(grpc.RpcError) as refused:
            next(_subscribe(near))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        relay.vanish()
        started = time.monotonic()
        while True:  # each attempt is answered at once: admitted, or refused while the slot is held
            try:
                assert next(_subscribe(near)).type == pb.CHANGE_TYPE_PROGRESS
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() - started < DEADLINE_SECONDS, "the vanished client kept its slot"
                threading.Event().wait(0.1)  # pace the attempts
        held.cancel()
    finally:
        far.close()
        near.close()
        relay.close()


def test_client_keepalive_pings_do_not_end_a_quiet_stream(tmp_path: Path) -> None:
    # Pings more often than the server accepts are "strikes"; the third ends the connection with
    # GOAWAY (too_many_pings) and fails its calls. gRPC's own server default accepts one ping in
    # five minutes, so a client pinging every few seconds on a stream with nothing to deliver
    # loses it within seconds.
    server = ServerProcess(tmp_path / "data", "--progress-seconds", "600", "--min-client-ping-seconds", "0.1").start()
    pinging = [
        ("grpc.keepalive_time_ms", 250),  # gRPC core sends about one a second at most
        ("grpc.http2.min_ping_interval_without_data_ms", 250),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.bdp_probe", 0),  # only keepalive pings
    ]
    channel = grpc.insecure_channel(server.address, options=pinging)
    try:
        stream = _subscribe(channel)
        assert next(stream).type == pb.CHANGE_TYPE_PROGRESS
        # The behaviour under test takes time: five or so pings, with nothing else on the stream.
        threading.Event().wait(5)
        pb_grpc.SessionServiceStub(channel).AppendMessage(
            pb.AppendMessageRequest(object_key="watched", message_json='{"id":"m1","role":"user","parts":[]}')
        )
        event = next(stream)
        assert (event.type, event.message.info.id) == (pb.CHANGE_TYPE_APPEND, "m1")
    finally:
        channel.close()
        server.stop()


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data").start()
    yield server
    server.stop()


def test_the_python_client_notices_a_vanished_server_during_a_subscription(plain_server: ServerProcess) -> None:
    relay = Blackhole(plain_server.address)
    client = SessionsClient(relay.address, keepalive_seconds=0.5, keepalive_timeout_seconds=0.5)
    events = client.object("watched").subscribe(include_progress=True, reconnect_attempts=0)
    try:
        assert next(events).type == "progress"
        relay.vanish()
        waiting = concurrent.futures.ThreadPoolExecutor(1)
        with pytest.raises(SessionsError) as failed:
            waiting.submit(next, events).result(timeout=DEADLINE_SECONDS)  # not forever
        waiting.shutdown(wait=False)
        assert failed.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        client.close()
        relay.close()


def test_the_asyncio_client_notices_a_vanished_server_during_a_subscription(plain_server: ServerProcess) -> None:
    relay = Blackhole(plain_server.address)

    async def scenario() -> grpc.StatusCode:
        client = aio.SessionsClient(relay.address, keepalive_seconds=0.5, keepalive_timeout_seconds=0.5)
        events = client.object("watched").subscribe(include_progress=True, reconnect_attempts=0)
        try:
            assert (await anext(events)).type == "progress"
            relay.vanish()
            with pytest.raises(SessionsError) as failed:
                await asyncio.wait_for(anext(events), DEADLINE_SECONDS)  # not forever
            return failed.value.code
        finally:
            await client.close()

    try:
        assert asyncio.run(scenario()) == grpc.StatusCode.UNAVAILABLE
    finally:
        relay.close()


def test_caller_options_override_the_client_keepalive() -> None:
    chosen = dict(channel_options([("grpc.keepalive_time_ms", 5_000), ("grpc.lb_policy_name", "pick_first")], 30, 10))
    assert chosen["grpc.keepalive_time_ms"] == 5_000
    assert chosen["grpc.keepalive_timeout_ms"] == 10_000
    assert chosen["grpc.lb_policy_name"] == "pick_first"
    assert channel_options([], None, 10) == [("grpc.max_reconnect_backoff_ms", 3_000)]  # keepalive off
