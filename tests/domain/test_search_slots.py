"""Searches beyond `max_concurrent_searches` wait for a slot, so a burst of slow searches leaves
SQL threads to other tenants' calls; the domain over real object files, no gRPC. The searches'
SQL is held on its threads (the real query runs once released), which is how a slow search
looks to everything else."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.errors import LimitExceeded
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import queries
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from tests.domain.searching import search

WAIT_SECONDS = 30  # a bound for a broken run, not a pace


class HeldSearches:
    """Replaces the search query with one that waits on its SQL thread until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.count = 0
        real = queries.search

        def held(conn: Any, *args: Any) -> Any:
            self.count += 1
            self.entered.release()
            assert self.release.wait(WAIT_SECONDS)
            return real(conn, *args)

        monkeypatch.setattr(queries, "search", held)

    async def until_entered(self, count: int) -> None:
        for _ in range(count):
            assert await asyncio.to_thread(self.entered.acquire, timeout=WAIT_SECONDS)


def message(message_id: str, text: str) -> AppendInput:
    body = f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{text}"}}]}}'
    return AppendInput(body, Parent.auto(), True)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Callable[..., SessionsService]]:
    executors: list[ThreadPoolExecutor] = []

    def make(**options: Any) -> SessionsService:
        executors.append(ThreadPoolExecutor(max_workers=4))
        return SessionsService(ObjectRegistry(tmp_path, executors[-1]), **options)

    yield make
    for executor in executors:
        executor.shutdown(wait=False, cancel_futures=True)


async def until(condition: Callable[[], bool]) -> None:
    """Lets the event loop run the other tasks until `condition` holds."""
    async with asyncio.timeout(WAIT_SECONDS):
        while not condition():
            await asyncio.sleep(0.001)


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(scenario)


def test_searches_past_the_limit_wait_and_other_calls_still_run(
    service: Callable[..., SessionsService], monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = service(max_concurrent_searches=2, search_seconds=WAIT_SECONDS)

    async def scenario() -> None:
        await sessions.append_many("searched", "", [message("m1", "hello world")])
        assert await search(sessions, "searched", "", "hello") != []  # builds the index: no write below
        held = HeldSearches(monkeypatch)
        searches = [asyncio.create_task(search(sessions, "searched", "", "hello")) for _ in range(4)]
        await held.until_entered(2)
        await until(lambda: sessions.search_slots.waiting == 2)
        assert (held.count, sessions.search_slots.running) == (2, 2)

        # Four SQL threads, two held by searches: another object's write and read still run.
        async with asyncio.timeout(WAIT_SECONDS):
            await sessions.append_many("other", "", [message("o1", "elsewhere")])
            assert [v.info.id async for window in sessions.history("other", "") for v in window] == ["o1"]
        assert held.count == 2

        held.release.set()
        results = await asyncio.gather(*searches)
        assert [[hit.id for hit in hits] for hits in results] == [["m1"]] * 4
        assert held.count == 4
        assert (sessions.search_slots.running, sessions.search_slots.waiting) == (0, 0)
        await sessions.registry.close_all()

    run(scenario())


def test_a_search_that_waits_its_whole_budget_is_refused_as_busy(
    service: Callable[..., SessionsService], monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = service(max_concurrent_searches=1, search_seconds=0.2)

    async def scenario() -> None:
        await sessions.append_many("searched", "", [message("m1", "hello world")])
        assert await search(sessions, "searched", "", "hello") != []
        held = HeldSearches(monkeypatch)
        first = asyncio.create_task(search(sessions, "searched", "", "hello"))
        await held.until_entered(1)

        with pytest.raises(LimitExceeded) as refused:
            await search(sessions, "searched", "", "hello")
        assert refused.value.reason == "SERVER_BUSY"
        assert "max_concurrent_searches" in str(refused.value)
        assert held.count == 1 and sessions.search_slots.waiting == 0

        held.release.set()
        await asyncio.gather(first, return_exceptions=True)  # its own budget passed while held
        assert sessions.search_slots.running == 0
        assert await search(sessions, "searched", "", "hello") != []  # the slot came back
        await sessions.registry.close_all()

    run(scenario())


def test_a_search_whose_caller_left_keeps_its_slot_until_its_sql_ends(
    service: Callable[..., SessionsService], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller that gives up (a deadline, a cancelled stream) cannot stop its query on the SQL
    # thread; were its slot given back then, abandoned searches would take every SQL thread.
    sessions = service(max_concurrent_searches=1, search_seconds=WAIT_SECONDS)

    async def scenario() -> None:
        await sessions.append_many("searched", "", [message("m1", "hello world")])
        assert await search(sessions, "searched", "", "hello") != []
        held = HeldSearches(monkeypatch)
        abandoned = asyncio.create_task(search(sessions, "searched", "", "hello"))
        await held.until_entered(1)
        abandoned.cancel()
        with pytest.raises(asyncio.CancelledError):
            await abandoned

        assert sessions.search_slots.running == 1  # its query still holds a SQL thread
        waiting = asyncio.create_task(search(sessions, "searched", "", "hello"))
        await until(lambda: sessions.search_slots.waiting == 1)
        assert held.count == 1

        held.release.set()
        assert [hit.id for hit in await waiting] == ["m1"]
        assert held.count == 2
        assert (sessions.search_slots.running, sessions.search_slots.waiting) == (0, 0)
        await sessions.registry.close_all()

    run(scenario())
