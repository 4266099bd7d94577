"""The plans a server holds for summaries made on the client are bounded: in time, in number and
in the ids they watch, the oldest let go first, and each watch ends with its plan (a watch left
behind would be told every commit of its object for the life of the server)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain.compaction import CompactionPlan
from sessions_server.domain.errors import FailedPrecondition
from sessions_server.domain.held_plans import HeldPlans
from sessions_server.storage.registry import ObjectRegistry


def _on_a_loop(test: Callable[..., Coroutine[None, None, None]]) -> Callable[..., None]:
    """Runs the async test on an event loop of its own (the plans' sweep is a loop timer)."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ObjectRegistry]:
    executor = ThreadPoolExecutor(max_workers=1)
    yield ObjectRegistry(tmp_path, executor)
    executor.shutdown()


def _plan(*ids: str) -> CompactionPlan:
    return CompactionPlan(ids[0], ids[-1], "prompt", 100, frozenset(ids))


def _hold(plans: HeldPlans, registry: ObjectRegistry, key: str, *ids: str) -> str:
    return plans.hold(key, "", _plan(*ids), registry.start_watch(key, ""))


def _held(plans: HeldPlans, token: str, key: str, *ids: str) -> bool:
    """Whether `token` is still held (taking it, then putting it back)."""
    try:
        held = plans.take(token, key, "", ids[0], ids[-1])
    except FailedPrecondition as refused:
        assert refused.reason == "PLAN_EXPIRED"
        return False
    plans.put_back(token, held)
    return True


def _watched_keys(registry: ObjectRegistry) -> set[str]:
    return set(registry._watches)


@_on_a_loop
async def test_a_plan_is_let_go_when_its_time_is_up_and_its_watch_with_it(registry: ObjectRegistry) -> None:
    clock = Clock()
    plans = HeldPlans(registry, hold_seconds=60, clock=clock)
    token = _hold(plans, registry, "k", "a", "b")
    clock.now += 59
    assert _held(plans, token, "k", "a", "b")
    clock.now += 1
    assert not _held(plans, token, "k", "a", "b")
    assert len(plans) == 0 and _watched_keys(registry) == set()


@_on_a_loop
async def test_the_sweep_lets_expired_plans_go_on_an_idle_server(registry: ObjectRegistry) -> None:
    clock = Clock()
    plans = HeldPlans(registry, hold_seconds=60, clock=clock)
    _hold(plans, registry, "k", "a")
    _hold(plans, registry, "other", "b")
    assert plans._sweep is not None  # set for the soonest expiry
    clock.now += 61
    plans._on_sweep()  # what the loop's timer runs
    assert len(plans) == 0 and _watched_keys(registry) == set() and plans._sweep is None


@_on_a_loop
async def test_a_holder_past_its_count_lets_go_of_its_own_oldest(registry: ObjectRegistry) -> None:
    """One caller making plans (a loop, a flood) lets go of its own, not of another's."""
    plans = HeldPlans(registry, max_plans_per_holder=3)
    theirs = plans.hold("k", "", _plan("t"), registry.start_watch("k", ""), holder="other")
    tokens = [_hold(plans, registry, "k", name) for name in "abcd"]
    assert [_held(plans, token, "k", name) for token, name in zip(tokens, "abcd", strict=True)] == [
        False,
        True,
        True,
        True,
    ]
    assert _held(plans, theirs, "k", "t")


@_on_a_loop
async def test_past_the_bytes_the_heaviest_holders_oldest_go_first(registry: ObjectRegistry) -> None:
    """A plan's ids are held in memory (an id may be 16 KiB): the server's bound lets go of the
    plans of the holder holding most, oldest first."""
    plans = HeldPlans(registry, max_bytes=3 * (100 + 1_000))
    light = plans.hold("k", "", _plan("a"), registry.start_watch("k", ""), holder="light")
    heavy = [plans.hold("k", "", _plan(name * 1_000), registry.start_watch("k", ""), holder="heavy") for name in "bc"]
    assert len(plans) == 3  # 2,301 bytes held
    newest = plans.hold("k", "", _plan("d" * 1_000), registry.start_watch("k", ""), holder="light")
    assert not _held(plans, heavy[0], "k", "b" * 1_000)  # the heaviest holder's oldest went
    assert _held(plans, heavy[1], "k", "c" * 1_000) and _held(plans, light, "k", "a")
    assert _held(plans, newest, "k", "d" * 1_000)


@_on_a_loop
async def test_a_taken_plan_released_or_closed_leaves_no_watch(registry: ObjectRegistry) -> None:
    plans = HeldPlans(registry)
    token = _hold(plans, registry, "k", "a")
    _hold(plans, registry, "other", "b")
    plans.release(plans.take(token, "k", "", "a", "a"))
    assert _watched_keys(registry) == {"other"}
    plans.close()
    assert len(plans) == 0 and _watched_keys(registry) == set() and plans._sweep is None


@_on_a_loop
async def test_a_plan_put_back_after_its_time_is_let_go(registry: ObjectRegistry) -> None:
    clock = Clock()
    plans = HeldPlans(registry, hold_seconds=60, clock=clock)
    token = _hold(plans, registry, "k", "a")
    held = plans.take(token, "k", "", "a", "a")
    clock.now += 60
    plans.put_back(token, held)
    assert len(plans) == 0 and _watched_keys(registry) == set()
