"""A subscription's wait for its next event times out on schedule however often it is woken: a
subscriber to one session of a busy object is woken by every other session's event, and each
wake restarted its full timeout, so it never timed out (its stream never got a progress event,
its resume point never moved on)."""

from __future__ import annotations

import asyncio

from sessions_server.storage.feed import ChangeEvent, FeedHub

TIMEOUT = 0.2
TRAFFIC_SECONDS = 5.0  # how long the other session is written at most: far past the timeout


def test_a_sessions_subscriber_times_out_on_schedule_while_other_sessions_are_written() -> None:
    async def run() -> None:
        hub = FeedHub()
        quiet = hub.subscribe("quiet", 0)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        published: list[ChangeEvent] = []

        async def busy_session() -> None:
            # Traffic, not synchronisation: another session's event ten times per timeout.
            until = loop.time() + TRAFFIC_SECONDS
            while not stop.is_set() and loop.time() < until:
                event = ChangeEvent("append", "busy", message_json="{}")
                hub.publish([event])
                published.append(event)
                await asyncio.sleep(TIMEOUT / 10)

        traffic = asyncio.ensure_future(busy_session())
        started = loop.time()
        item = await quiet.next(timeout=TIMEOUT)
        waited = loop.time() - started
        stop.set()
        await traffic

        assert item is None  # nothing of its session: the caller reports progress...
        assert TIMEOUT * 0.9 <= waited < TRAFFIC_SECONDS / 2, waited  # ...on schedule
        assert len(published) >= 3  # while the other session was being written
        assert hub.revision >= published[-1].revision  # ...at a revision past those events

    asyncio.run(run())


def test_a_wait_still_ends_at_once_with_an_event_of_its_session() -> None:
    async def run() -> None:
        hub = FeedHub()
        mine = hub.subscribe("mine", 0)
        hub.publish([ChangeEvent("append", "other", message_json="{}")])
        own = ChangeEvent("append", "mine", message_json="{}")

        async def later() -> None:
            await asyncio.sleep(0)
            hub.publish([ChangeEvent("append", "other", message_json="{}"), own])

        publisher = asyncio.ensure_future(later())
        assert await mine.next(timeout=30) is own
        await publisher

    asyncio.run(run())
