"""Every call is metered where its handler is registered (no per-call interceptor): each kind of
handler, ours and the stock health and reflection ones, is counted and timed once, with its
status code, and given the caller's request id. (The in-flight count while a handler waits:
tests/service/test_lone_writes.py.)"""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.transport.handlers import WrappingRegistrar, _WrappedLookup
from sessions_server.transport.metrics import MAX_REQUEST_ID_CHARS, CallMeter, Metrics, request_id
from tests.conftest import start_server
from tests.deploy.support import free_port
from tests.reliability.support import wait_until


def _rpcs(port: int) -> dict[tuple[str, str], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.findall(
        r'^sessions_rpcs_total\{code="(\w+)",method="(\w+)",reason="\w*",service="[\w.]+"\} (\S+)$', body, re.MULTILINE
    )
    return {(method, code): float(count) for code, method, count in found}


def test_every_kind_of_handler_is_counted_once_with_its_code(tmp_path: Path) -> None:
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        calls = server.running.calls
        with grpc.insecure_channel(server.address) as channel:
            # Registered stock handlers (looked up by name), unary.
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            # Stock bidirectional stream, answered by an async generator.
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            md = routing_metadata("metered")
            # Our unary handler, and a server stream written through its context.
            stub.AppendMessage(
                pb.AppendMessageRequest(object_key="metered", message_json='{"id":"m1","role":"user","parts":[]}'),
                metadata=md,
            )
            list(stub.GetLatestLeaf(pb.GetLatestLeafRequest(object_key="metered"), metadata=md))
            # A change feed: counted as it ends, never as in flight.
            feed = stub.Subscribe(pb.SubscribeRequest(object_key="metered"), metadata=md, timeout=60)
            assert next(feed).type == pb.CHANGE_TYPE_PROGRESS
            assert calls.calls_in_flight == 0
            feed.cancel()
            # A failing call keeps its code.
            with pytest.raises(grpc.RpcError) as failed:
                stub.AppendMessage(pb.AppendMessageRequest(object_key="metered", message_json="{"), metadata=md)
            assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # A method nobody registered is not a call of ours.
            with pytest.raises(grpc.RpcError) as unknown:
                channel.unary_unary("/sessions.v1.SessionService/NoSuchMethod")(b"")
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED

        expected = {
            ("Check", "OK"): 1.0,
            ("ServerReflectionInfo", "OK"): 1.0,
            ("AppendMessage", "OK"): 1.0,
            ("GetLatestLeaf", "OK"): 1.0,
            ("Subscribe", "CANCELLED"): 1.0,
            ("AppendMessage", "INVALID_ARGUMENT"): 1.0,
        }
        seen: list[dict[tuple[str, str], float]] = [{}]

        def all_counted() -> bool:  # a stream is counted as its handler unwinds, after the client has let go
            seen[0] = _rpcs(port)
            return seen[0] == expected

        assert wait_until(all_counted, timeout=10), seen[0]
        assert calls.calls_in_flight == 0
        assert calls.calls_started == 5  # all but the health check
    finally:
        server.stop()


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def test_a_generic_lookup_wraps_each_found_method_once_and_keeps_no_unknown_name() -> None:
    wraps: list[str] = []

    def wrap(method: str, handler: Any) -> Any:
        wraps.append(method)
        return handler

    async def behavior(request: bytes, context: Any) -> bytes:
        return request

    inner = grpc.method_handlers_generic_handler("t.Service", {"Known": grpc.unary_unary_rpc_method_handler(behavior)})
    lookup = _WrappedLookup(inner, wrap)
    first = lookup.service(_Details("/t.Service/Known"))  # type: ignore[arg-type]
    assert first is not None
    assert all(lookup.service(_Details("/t.Service/Known")) is first for _ in range(5))  # type: ignore[arg-type]
    for i in range(1_000):
        assert lookup.service(_Details(f"/t.Service/Unknown{i}")) is None  # type: ignore[arg-type]
    assert wraps == ["/t.Service/Known"]
    assert len(lookup._wrapped) == 1


@pytest.fixture
def request_id_server() -> Iterator[str]:
    """A bare grpc.aio server whose one method answers the request id its call was given."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def answer_id(request: bytes, context: Any) -> bytes:
        return request_id.get().encode()

    async def build() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        meter = CallMeter(Metrics())
        registrar = WrappingRegistrar(server, meter.metered)
        handler = grpc.unary_unary_rpc_method_handler(answer_id)
        registrar.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Ids", {"Id": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(build(), loop).result(timeout=30)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def test_a_call_carries_the_callers_request_id_or_a_fresh_one(request_id_server: str) -> None:
    with grpc.insecure_channel(request_id_server) as channel:
        ask = channel.unary_unary("/t.Ids/Id")
        assert ask(b"", metadata=(("x-request-id", "trace-7f3a"),)) == b"trace-7f3a"
        fresh = [ask(b"").decode() for _ in range(3)]
    assert len(set(fresh)) == 3
    assert all(re.fullmatch(r"[0-9a-f]{16}", value) for value in fresh)


def test_a_long_request_id_is_cut_to_its_limit(request_id_server: str) -> None:
    """A caller's id is written into every log line of its call: one of 6 KB was, whole."""
    long_id = "r" * 6_000
    with grpc.insecure_channel(request_id_server) as channel:
        ask = channel.unary_unary("/t.Ids/Id")
        assert ask(b"", metadata=(("x-request-id", long_id),)) == b"r" * MAX_REQUEST_ID_CHARS
