"""With tokens, searches waiting for one of `--max-concurrent-searches` are served fairly across
tokens, through gRPC: a tenant's search queued behind another tenant's runs as soon as a slot
frees. In one queue it waited for every search the other tenant had queued before it (an
audit: a 1 ms search took seconds, or was refused).

Each search's SQL is held on its thread until the test lets it go, one at a time, so the order
in which they reach SQL is the order the slots were given in."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain import service as service_module
from sessions_server.storage import queries
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.security.tenants import tenant_tokens
from tests.service.support import text_message

WAIT_SECONDS = 30.0  # a bound for a broken run, not a pace


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    tokens = tenant_tokens(tmp_path / "tokens.json", ("a", "b"))
    live = start_server(tmp_path / "data", tokens_file=tokens, max_concurrent_searches=1, search_seconds=WAIT_SECONDS)
    yield live
    live.stop()


class HeldSql:
    """The search query, held on its SQL thread until `let_one_go`; `entered` gives each
    held query's words, in the order they reached SQL."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered: queue.Queue[str] = queue.Queue()
        self._permits = threading.Semaphore(0)
        real = queries.search

        def held(conn: Any, scope: Any, expression: str, wanted: int) -> Any:
            self.entered.put(expression)
            assert self._permits.acquire(timeout=WAIT_SECONDS)
            return real(conn, scope, expression, wanted)

        monkeypatch.setattr(queries, "search", held)
        # On a read thread, not in place on the event loop (which a lone call's read of a small
        # object may use): held there, it would hold every call.
        monkeypatch.setattr(service_module, "IN_PLACE_MAX_OBJECT_BYTES", -1)

    def next_entered(self) -> str:
        return self.entered.get(timeout=WAIT_SECONDS)

    def let_go(self, count: int = 1) -> None:
        self._permits.release(count)


def test_a_tenants_search_runs_before_another_tenants_queued_ones(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for tenant, word in (("a", "alpha"), ("b", "beta")):
        with SessionsClient(server.address, token=f"{tenant}-secret") as client:
            session = client.object(f"tenant-{tenant}/notes").session()
            session.append_message(text_message("m1", word))
            assert [hit.id for hit in session.search(word)] == ["m1"]  # the index built
    slots = server.running.service.search_slots
    held = HeldSql(monkeypatch)

    with grpc.insecure_channel(server.address) as channel, ThreadPoolExecutor(max_workers=5) as pool:
        stub = pb_grpc.SessionServiceStub(channel)

        def search(tenant: str, word: str) -> list[Any]:
            key = f"tenant-{tenant}/notes"
            metadata = (("authorization", f"Bearer {tenant}-secret"), ("x-object-key", key))
            request = pb.SearchMessagesRequest(object_key=key, query=word)
            return list(stub.SearchMessages(request, metadata=metadata, timeout=2 * WAIT_SECONDS))

        calls = [pool.submit(search, "a", "alpha")]
        assert held.next_entered() == '"alpha"'  # A's first search runs, holding the one slot
        calls += [pool.submit(search, "a", "alpha") for _ in range(3)]
        assert wait_until(lambda: slots.waiting == 3, WAIT_SECONDS)
        calls.append(pool.submit(search, "b", "beta"))  # queued after A's three
        assert wait_until(lambda: slots.waiting == 4, WAIT_SECONDS)
        try:
            order = []
            for _ in range(4):
                held.let_go()
                order.append(held.next_entered())
            assert order == ['"beta"', '"alpha"', '"alpha"', '"alpha"']
        finally:
            held.let_go(5)
        for call in calls:
            assert len(call.result(timeout=WAIT_SECONDS)) == 1
    assert (slots.running, slots.waiting) == (0, 0)
