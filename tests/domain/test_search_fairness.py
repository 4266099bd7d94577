"""Searches waiting for a slot (`SearchSlots`) are served fairly across tenants: a slot that
frees goes to the tenant with the fewest searches running, then to the one served least
recently, then to the first come. In one queue, a tenant's light search waited behind every
heavy search another tenant had queued. Without tenants (no tokens): first come, first served.

The slots alone, no SQL: each search holds its slot until the test ends it. Nothing sleeps:
the loop is only let run until the searches started are queued."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from sessions_server.domain.errors import LimitExceeded
from sessions_server.domain.search import SearchSlots

BUDGET_SECONDS = 30.0  # a bound for a broken run, not a pace
LOOP_TURNS = 100  # what "until queued" may take, counted in turns of the loop, not in time


class Searches:
    """Searches that take a slot, say so (`started`, in order), and hold it until `end`."""

    def __init__(self, slots: SearchSlots) -> None:
        self.slots = slots
        self.started: list[str] = []
        self._ends: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ended = 0

    async def start(self, name: str, tenant: str | None) -> None:
        """Starts a search named `name` (its tenant first, as `a1`), and returns once it runs or
        waits."""
        end = self._ends[name] = asyncio.Event()
        waiting = self.slots.waiting

        async def search() -> None:
            async with self.slots.taken(time.monotonic() + BUDGET_SECONDS, tenant):
                self.started.append(name)
                await end.wait()

        self._tasks[name] = asyncio.create_task(search())
        await self.until(lambda: name in self.started or self.slots.waiting == waiting + 1)

    async def end(self, name: str) -> None:
        """Ends a running search, and returns once the search given its slot, if any, runs."""
        await self.end_alone(name)
        await self.until(lambda: len(self.started) - self._ended == self.slots.running)

    async def end_alone(self, name: str) -> None:
        """Ends a running search, and returns as soon as it has given its slot back."""
        self._ends[name].set()
        await self._tasks[name]
        self._ended += 1

    def cancel(self, name: str) -> asyncio.Task[None]:
        self._tasks[name].cancel()
        return self._tasks[name]

    @staticmethod
    async def until(condition: Any) -> None:
        for _ in range(LOOP_TURNS):
            if condition():
                return
            await asyncio.sleep(0)  # one turn of the loop: the other tasks' ready steps run
        raise AssertionError("the searches did not get there")


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(scenario)


def test_without_tenants_the_waiters_go_first_come_first_served() -> None:
    async def scenario() -> None:
        searches = Searches(SearchSlots(1))
        for name in ("s1", "s2", "s3", "s4"):
            await searches.start(name, None)
        for name in ("s1", "s2", "s3"):
            await searches.end(name)
        assert searches.started == ["s1", "s2", "s3", "s4"]
        await searches.end("s4")
        assert (searches.slots.running, searches.slots.waiting) == (0, 0)

    run(scenario())


def test_a_freed_slot_goes_to_the_tenant_with_the_fewest_searches_running() -> None:
    """A holds both slots with two more queued; B's one search, queued after them, runs next."""

    async def scenario() -> None:
        searches = Searches(SearchSlots(2))
        for name in ("a1", "a2", "a3", "a4"):
            await searches.start(name, "A")
        await searches.start("b1", "B")
        await searches.start("a5", "A")
        assert searches.started == ["a1", "a2"]
        await searches.end("a1")
        assert searches.started[-1] == "b1"  # A runs 1, B none
        await searches.end("a2")
        assert searches.started[-1] == "a3"  # A runs none, B 1
        await searches.end("b1")
        assert searches.started[-1] == "a4"  # B has nothing waiting
        for name in ("a3", "a4", "a5"):
            await searches.end(name)
        assert searches.started == ["a1", "a2", "b1", "a3", "a4", "a5"]
        assert (searches.slots.running, searches.slots.waiting) == (0, 0)

    run(scenario())


def test_with_one_slot_the_tenants_take_turns() -> None:
    """Both tenants run none when the slot frees: the one served least recently goes next."""

    async def scenario() -> None:
        searches = Searches(SearchSlots(1))
        for name, tenant in (("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B"), ("c1", "C")):
            await searches.start(name, tenant)
        for name in ("a1", "b1", "c1", "a2", "b2"):
            await searches.end(name)
        await searches.end("a3")
        assert searches.started == ["a1", "b1", "c1", "a2", "b2", "a3"]

    run(scenario())


def test_a_search_that_waits_past_its_budget_is_refused_busy_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        slots = SearchSlots(1)
        searches = Searches(slots)
        await searches.start("a1", "A")
        with pytest.raises(LimitExceeded) as refused:
            async with slots.taken(time.monotonic() - 1.0, "B"):  # its budget already spent
                raise AssertionError("given a slot")
        assert refused.value.reason == "SERVER_BUSY"
        assert refused.value.metadata["limit"] == "max_concurrent_searches"
        assert (slots.running, slots.waiting) == (1, 0)
        await searches.end("a1")
        assert (slots.running, slots.waiting) == (0, 0)

    run(scenario())


def test_a_slot_given_to_a_waiter_whose_caller_just_left_goes_to_the_next() -> None:
    async def scenario() -> None:
        slots = SearchSlots(1)
        searches = Searches(slots)
        await searches.start("a1", "A")
        await searches.start("b1", "B")
        await searches.start("c1", "C")
        await searches.end_alone("a1")  # b1 is given the slot ...
        assert slots.waiting == 1 and "b1" not in searches.started
        left = searches.cancel("b1")  # ... as its caller leaves, before it runs
        with pytest.raises(asyncio.CancelledError):
            await left
        await searches.until(lambda: "c1" in searches.started)
        assert searches.started == ["a1", "c1"]
        assert (slots.running, slots.waiting) == (1, 0)
        await searches.end("c1")
        assert slots.running == 0

    run(scenario())
