"""The feed hub on its own: revisions, retention by count and bytes, bounded subscriber queues."""

from __future__ import annotations

import asyncio

from sessions_server.storage.feed import ChangeEvent, FeedHub, FeedSettings, Reset


def _events(count: int, size: int = 10) -> list[ChangeEvent]:
    return [ChangeEvent("append", "", message_json="x" * size) for _ in range(count)]


async def _drain(subscription, count: int) -> list[ChangeEvent | Reset]:  # type: ignore[no-untyped-def]
    return [await subscription.next(timeout=1) for _ in range(count)]


def test_revisions_increase_and_resume_replays_exactly_what_followed() -> None:
    async def run() -> None:
        hub = FeedHub()
        first = _events(5)
        hub.publish(first)
        assert [e.revision for e in first] == sorted({e.revision for e in first})
        resumed = hub.subscribe(None, first[1].revision)
        got = await _drain(resumed, 3)
        assert got == first[2:]
        assert await resumed.next(timeout=0.01) is None  # nothing more: a progress point

    asyncio.run(run())


def test_resume_beyond_retention_by_count_or_bytes_resets() -> None:
    async def run() -> None:
        by_count = FeedHub(FeedSettings(retain_events=3))
        events = _events(6)
        by_count.publish(events)
        reset = await by_count.subscribe(None, events[0].revision).next(timeout=1)
        assert isinstance(reset, Reset) and "not retained" in reset.reason
        kept = await _drain(by_count.subscribe(None, events[2].revision), 3)
        assert kept == events[3:]

        by_bytes = FeedHub(FeedSettings(retain_bytes=3 * (256 + 100)))
        big = _events(6, size=100)
        by_bytes.publish(big)
        assert isinstance(await by_bytes.subscribe(None, big[0].revision).next(timeout=1), Reset)

    asyncio.run(run())


def test_a_slow_subscriber_overflows_into_a_reset_and_writers_never_wait() -> None:
    async def run() -> None:
        hub = FeedHub(FeedSettings(queue_events=3))
        slow = hub.subscribe(None, 0)
        fast = hub.subscribe(None, 0)
        for event in _events(10):
            hub.publish([event])  # never blocks, whoever is behind
            assert await fast.next(timeout=1) is event
        items = [await slow.next(timeout=1) for _ in range(3)]
        assert isinstance(items[0], Reset) and "overflowed" in items[0].reason
        # After the reset only what was published after the overflow follows, in order.
        tail = [item for item in items[1:] if isinstance(item, ChangeEvent)]
        assert [e.revision for e in tail] == sorted(e.revision for e in tail)

    asyncio.run(run())


def test_a_restart_is_an_unknown_revision() -> None:
    async def run() -> None:
        before = FeedHub()
        old = _events(2)
        before.publish(old)
        after = FeedHub()  # reopened (or restarted): a later epoch, even within the same millisecond
        after.publish(_events(1))
        assert after.revision > old[-1].revision
        item = await after.subscribe(None, old[-1].revision).next(timeout=1)
        assert isinstance(item, Reset) and "restarted" in item.reason
        future = await after.subscribe(None, after.revision + (1 << 40)).next(timeout=1)
        assert isinstance(future, Reset)

    asyncio.run(run())
