"""A token's unary calls take turns (transport/call_turns.py): at most `per_token` run at once,
the rest wait in order, and another token's call goes in at once. Driven on one event loop,
each step let run by yielding to it, never by waiting for time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sessions_server.transport.call_turns import CallTurns


async def _settle() -> None:
    for _ in range(5):  # a few turns of the loop: every task that can go on does
        await asyncio.sleep(0)


class _Calls:
    """Calls that hold their turn until released, noting the order in which they got it."""

    def __init__(self, turns: CallTurns) -> None:
        self.turns = turns
        self.started: list[str] = []
        self._releases: dict[str, asyncio.Event] = {}

    def begin(self, name: str, token: str | None) -> asyncio.Task[None]:
        release = self._releases[name] = asyncio.Event()

        async def call() -> None:
            async with self.turns.turn(token):
                self.started.append(name)
                await release.wait()

        return asyncio.create_task(call())

    def end(self, name: str) -> None:
        self._releases[name].set()


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_a_tokens_calls_beyond_its_bound_wait_in_order_while_another_tokens_go_in() -> None:
    async def scenario() -> None:
        calls = _Calls(CallTurns(per_token=2))
        for name in ("a1", "a2", "a3", "a4"):
            calls.begin(name, "A")
        await _settle()
        assert calls.started == ["a1", "a2"] and calls.turns.waiting == 2
        b = calls.begin("b1", "B")
        await _settle()
        assert calls.started == ["a1", "a2", "b1"]  # B is not behind A's queue
        calls.end("a2")
        await _settle()
        assert calls.started == ["a1", "a2", "b1", "a3"] and calls.turns.running("A") == 2
        calls.end("b1")
        await b
        assert calls.turns.running("B") == 0
        for name in ("a1", "a3", "a4"):
            calls.end(name)
        await _settle()
        assert calls.started[-1] == "a4" and calls.turns.waiting == 0 and calls.turns.running("A") == 0

    _run(scenario)


def test_without_tokens_or_a_bound_nothing_waits() -> None:
    async def scenario() -> None:
        for turns, token in ((CallTurns(per_token=1), None), (CallTurns(per_token=0), "A")):
            calls = _Calls(turns)
            for name in ("c1", "c2", "c3"):
                calls.begin(name, token)
            await _settle()
            assert calls.started == ["c1", "c2", "c3"] and turns.waiting == 0
            for name in ("c1", "c2", "c3"):
                calls.end(name)
            await _settle()

    _run(scenario)


def test_a_waiting_call_that_is_cancelled_leaves_the_queue_and_the_turns_go_on() -> None:
    async def scenario() -> None:
        calls = _Calls(CallTurns(per_token=1))
        calls.begin("a1", "A")
        waiting = calls.begin("a2", "A")
        calls.begin("a3", "A")
        await _settle()
        waiting.cancel()
        await _settle()
        assert calls.turns.waiting == 1
        calls.end("a1")
        await _settle()
        assert calls.started == ["a1", "a3"] and calls.turns.running("A") == 1
        calls.end("a3")
        await _settle()
        assert calls.turns.running("A") == 0 and calls.turns.waiting == 0

    _run(scenario)


def test_a_call_cancelled_as_its_turn_came_passes_the_turn_on() -> None:
    """Its turn given (the future resolved) but the call cancelled before it ran: the turn goes
    to the next waiting call, not lost, and the running count stays right."""

    async def scenario() -> None:
        calls = _Calls(CallTurns(per_token=1))
        calls.begin("a1", "A")
        second = calls.begin("a2", "A")
        calls.begin("a3", "A")
        await _settle()
        calls.end("a1")
        await asyncio.sleep(0)  # a1 leaves its block and hands its turn to a2, which has not run yet
        second.cancel()
        await _settle()
        assert "a2" not in calls.started and calls.started[-1] == "a3"
        assert calls.turns.running("A") == 1 and calls.turns.waiting == 0
        calls.end("a3")
        await _settle()
        assert calls.turns.running("A") == 0

    _run(scenario)


def test_a_call_cancelled_while_its_turn_is_passed_to_it_is_skipped() -> None:
    """Cancelled (its future cancelled) before it could leave the queue, then a turn is passed:
    the turn goes to the call after it, and nothing raises in the call that passes it on."""

    async def scenario() -> None:
        calls = _Calls(CallTurns(per_token=1))
        first = calls.begin("a1", "A")
        second = calls.begin("a2", "A")
        calls.begin("a3", "A")
        await _settle()
        second.cancel()  # its future is cancelled now; its except block runs at its next step
        calls.end("a1")
        await _settle()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        assert calls.started == ["a1", "a3"] and calls.turns.running("A") == 1 and calls.turns.waiting == 0
        calls.end("a3")
        await _settle()
        assert calls.turns.running("A") == 0

    _run(scenario)
