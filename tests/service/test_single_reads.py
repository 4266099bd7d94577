"""A read that answers one message at most (GetMessage, GetLatestLeaf) is a server stream: the
Python client read its one message and cancelled the call, before the status that followed it.
The server, still finishing the call, then counted a read that had succeeded as CANCELLED (1 in
10 to 20 of them against a server in a process of its own): noise on every error-ratio
dashboard. The clients read such a call to its end (as the TypeScript and Go clients do)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from sessions_client import SessionsClient
from sessions_client import aio as sessions_aio
from tests.service.support import text_message


class _Watched:
    """A server-stream call that notes a cancel that came before its end was read."""

    def __init__(self, call: Any, method: str, early: list[str]) -> None:
        self._call = call
        self._method = method
        self._early = early
        self._ended = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except (StopIteration, grpc.RpcError):
            self._ended = True
            raise

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[Any]:
        try:
            async for response in self._call:
                yield response
        except grpc.RpcError:
            self._ended = True
            raise
        self._ended = True

    def cancel(self) -> bool:
        if not self._ended:
            self._early.append(self._method)
        return bool(self._call.cancel())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class _WatchingStub:
    """The client's stub, each server stream's call watched."""

    def __init__(self, stub: Any, early: list[str]) -> None:
        self._stub = stub
        self._early = early

    def __getattr__(self, method: str) -> Any:
        real = getattr(self._stub, method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return _Watched(real(*args, **kwargs), method, self._early)

        return call


def _served(live_server: Any, method: str) -> dict[str, float]:
    """The server's count of `method`'s calls by code."""
    counted: dict[str, float] = {}
    for (_, name, code, _), counter in list(live_server.running.calls._counters.items()):
        if name == method:
            counted[code] = counted.get(code, 0.0) + counter._value.get()
    return counted


def test_a_single_message_read_is_read_to_its_end(live_server: Any, object_key: str) -> None:
    before = {method: _served(live_server, method) for method in ("GetMessage", "GetLatestLeaf")}
    early: list[str] = []
    with SessionsClient(live_server.address) as client:
        session = client.object(object_key).session()
        session.append_messages([text_message(f"m{i}") for i in range(3)])
        client._stub = _WatchingStub(client._stub, early)
        for _ in range(10):
            assert session.get_message("m1") == text_message("m1")
            assert session.get_latest_leaf() == text_message("m2")
        assert session.get_message("absent") is None
    assert early == []  # before: every read with its message was cancelled after it
    # Each call was counted as its handler ended, before the status the client read.
    after = {method: _served(live_server, method) for method in ("GetMessage", "GetLatestLeaf")}
    for method, runs in (("GetMessage", 11), ("GetLatestLeaf", 10)):
        added = {code: count - before[method].get(code, 0.0) for code, count in after[method].items()}
        assert {code: count for code, count in added.items() if count} == {"OK": runs}, method


def test_the_asyncio_client_reads_a_single_message_read_to_its_end(live_server: Any, object_key: str) -> None:
    early: list[str] = []

    async def scenario() -> None:
        async with sessions_aio.SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            await session.append_messages([text_message(f"m{i}") for i in range(3)])
            client._stub = _WatchingStub(client._stub, early)
            for _ in range(10):
                assert await session.get_message("m1") == text_message("m1")
                assert await session.get_latest_leaf() == text_message("m2")
            assert await session.get_message("absent") is None

    asyncio.run(scenario())
    assert early == []
