"""With tokens, the server's stream slots are shared fairly (transport/fair_share.py): two
tenants' idle feeds, each within its `--max-streams-per-token`, took every slot of the server,
and every read of a third tenant (holding none) was refused LIMIT_EXCEEDED, which the clients
do not retry, with a message blaming streams it did not hold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server
from tests.security.tenants import tenant_tokens
from tests.security.test_auth_tls import _live_feed
from tests.service.support import text_message

POOL = 20
PER_TOKEN = 10
TENANTS = ("a", "b", "c")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    tokens = tenant_tokens(tmp_path / "tokens.json", TENANTS)
    limits = Limits(max_concurrent_streams=POOL, max_streams_per_token=PER_TOKEN)
    live = start_server(tmp_path / "data", tokens_file=tokens, limits=limits)
    yield live
    live.stop()


def _feeds_until_refused(channel: grpc.Channel, tenant: str) -> tuple[list[Any], SessionsError | None]:
    """Up to `PER_TOKEN` idle feeds of `tenant`, and the refusal that stopped them, if any."""
    feeds: list[Any] = []
    for index in range(PER_TOKEN):
        try:
            feeds.append(_live_feed(channel, f"{tenant}-secret", f"tenant-{tenant}/feed{index}"))
        except grpc.RpcError as refused:
            return feeds, SessionsError.from_rpc_error(refused)
    return feeds, None


def test_a_tenant_holding_no_stream_reads_while_two_others_hold_all_they_may(server: LiveServer) -> None:
    key = "tenant-b/conversation"
    with SessionsClient(server.address, token="b-secret") as b:
        b.object(key).session().append_message(text_message("m1", "hello"))
        with grpc.insecure_channel(server.address) as channel:
            held_by_a, refused_a = _feeds_until_refused(channel, "a")
            held_by_c, refused_c = _feeds_until_refused(channel, "c")
            try:
                # B reads: raw stubs (no retry), and the client.
                stub = pb_grpc.SessionServiceStub(channel)
                metadata = (("authorization", "Bearer b-secret"), ("x-object-key", key))
                got = list(
                    stub.GetMessage(
                        pb.GetMessageRequest(object_key=key, message_id="m1"), metadata=metadata, timeout=30
                    )
                )
                assert [json.loads(response.frame.json)["id"] for response in got] == ["m1"]
                assert [m["id"] for m in b.object(key).session().get_history()] == ["m1"]
                b_feed = _live_feed(channel, "b-secret", key)
                b_feed.cancel()

                # A took half the pool before it was contended; C then took its share of the rest.
                assert (len(held_by_a), refused_a) == (PER_TOKEN, None)
                assert 0 < len(held_by_c) < PER_TOKEN
                assert refused_c is not None
                assert (refused_c.code, refused_c.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER_BUSY")
                assert refused_c.metadata.get("limit") == "max_concurrent_streams"
                assert f"this token holds {len(held_by_c)} streams, its share" in refused_c.message
            finally:
                for feed in (*held_by_a, *held_by_c):
                    feed.cancel()
