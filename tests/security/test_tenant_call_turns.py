"""With tokens, one token's unary calls beyond `--max-calls-per-token` wait their turn, and
another token's go in at once (transport/call_turns.py): one tenant with 128 appends in flight
made every other tenant's append wait behind them (280 ms for a 5 ms call, in the audit)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.security.tenants import tenant_tokens
from tests.service.support import text_message

WAIT_SECONDS = 30.0  # a bound for a broken run, not a pace


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    tokens = tenant_tokens(tmp_path / "tokens.json", ("a", "b"))
    live = start_server(tmp_path / "data", tokens_file=tokens, limits=Limits(max_calls_per_token=1))
    yield live
    live.stop()


def _waiting(server: LiveServer) -> float:
    return server.running.metrics.registry.get_sample_value("sessions_calls_waiting_for_turn") or 0.0


def _append(stub: Any, tenant: str, key: str, message_id: str) -> Any:
    request = pb.AppendMessageRequest(object_key=key, message_json=json.dumps(text_message(message_id)))
    return stub.AppendMessage.future(request, metadata=routing_metadata(key, f"{tenant}-secret"), timeout=WAIT_SECONDS)


def test_a_tokens_call_past_its_bound_waits_while_another_tokens_call_goes_in(server: LiveServer) -> None:
    held_key = "tenant-a/held"
    running, gate = threading.Event(), threading.Event()

    def hold(ctx: Any) -> None:  # the write job of the object: A's first append queues behind it
        running.set()
        gate.wait(WAIT_SECONDS)

    holding: list[Any] = []

    async def hold_the_writer() -> None:
        async with server.running.registry.use(held_key) as store:
            holding.append(store)
            await store.write(hold)

    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        held = asyncio.run_coroutine_threadsafe(hold_the_writer(), server.loop)
        try:
            assert running.wait(WAIT_SECONDS), "the holding write never ran"
            first = _append(stub, "a", held_key, "a1")  # A's one turn, held by the writer
            assert wait_until(lambda: holding[0].queued_writes == 1, WAIT_SECONDS), "A's first append never queued"
            second = _append(stub, "a", "tenant-a/free", "a2")  # an object nobody holds: waits its turn
            assert wait_until(lambda: _waiting(server) == 1, WAIT_SECONDS), "A's second append did not wait"
            other = _append(stub, "b", "tenant-b/free", "b1")
            assert other.result(timeout=WAIT_SECONDS).message.info.id == "b1"  # B went in past A's queue
            assert not second.done() and _waiting(server) == 1
        finally:
            gate.set()
        held.result(timeout=WAIT_SECONDS)
        assert first.result(timeout=WAIT_SECONDS).message.info.id == "a1"
        assert second.result(timeout=WAIT_SECONDS).message.info.id == "a2"
    assert _waiting(server) == 0
