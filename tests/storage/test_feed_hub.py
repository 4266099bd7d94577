"""The feed hub on its own: revisions, retention by count and bytes, subscribers as places in
the retained events."""

from __future__ import annotations

import asyncio
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from sessions_server.storage.feed import (
    DROPPED_SESSIONS_REMEMBERED,
    STALLED_SECONDS,
    ChangeEvent,
    FeedClosed,
    FeedHub,
    Feeds,
    FeedSettings,
    Reset,
)
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Compaction


def watched(hub: FeedHub) -> FeedHub:
    """`hub` after a subscriber came and went: a feed keeps its events for resumes only from
    its first subscriber on (before it, nobody was told a revision to resume from)."""
    hub.unsubscribe(hub.subscribe(None, 0))
    return hub


def _events(count: int, size: int = 10) -> list[ChangeEvent]:
    return [ChangeEvent("append", "", message_json="x" * size) for _ in range(count)]


async def _drain(subscription, count: int) -> list[ChangeEvent | Reset]:  # type: ignore[no-untyped-def]
    """Up to `count` items, fewer when one is not there within a second."""
    items = []
    while len(items) < count and (item := await subscription.next(timeout=1)) is not None:
        items.append(item)
    return items


def test_revisions_increase_and_resume_replays_exactly_what_followed() -> None:
    async def run() -> None:
        hub = watched(FeedHub())
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
        by_count = watched(FeedHub(FeedSettings(retain_events=3)))
        events = _events(6)
        by_count.publish(events)
        reset = await by_count.subscribe(None, events[0].revision).next(timeout=1)
        assert isinstance(reset, Reset) and "not retained" in reset.reason
        kept = await _drain(by_count.subscribe(None, events[2].revision), 3)
        assert kept == events[3:]

        by_bytes = watched(FeedHub(FeedSettings(retain_bytes=3 * (256 + 100))))
        big = _events(6, size=100)
        by_bytes.publish(big)
        assert isinstance(await by_bytes.subscribe(None, big[0].revision).next(timeout=1), Reset)

    asyncio.run(run())


def test_a_subscriber_the_ring_passes_by_is_reset_and_writers_never_wait() -> None:
    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=3)))
        slow = hub.subscribe(None, 0)
        fast = hub.subscribe(None, 0)
        for event in _events(10):
            hub.publish([event])  # never blocks, whoever is behind
            assert await fast.next(timeout=1) is event
        reset = await slow.next(timeout=1)
        assert isinstance(reset, Reset) and "fell behind" in reset.reason
        assert reset.revision == hub.revision
        assert await slow.next(timeout=0) is None  # placed after the reset: live from there
        later = _events(1)
        hub.publish(later)
        assert await slow.next(timeout=1) is later[0]

    asyncio.run(run())


def _session_events(session_id: str, count: int) -> list[ChangeEvent]:
    return [ChangeEvent("append", session_id, message_json="x" * 10) for _ in range(count)]


def test_a_sessions_subscriber_is_not_reset_for_other_sessions_events_the_ring_drops() -> None:
    """A subscriber to one session passes other sessions' events by unread; when retention drops
    them before it got to them (commits published before its task ran, or while it waited to
    send), it has missed nothing and must not be reset, which would make it re-read its session.
    One that had an event of its own dropped is reset, as before."""

    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=3)))
        mine = hub.subscribe("mine", 0)
        everyone = hub.subscribe(None, 0)
        hub.publish(_session_events("other", 5))
        hub.publish(_session_events("other", 5))  # drops the first commit before anyone ran
        assert hub.first_seq > 0
        reset = await everyone.next(timeout=1)
        assert isinstance(reset, Reset) and "fell behind" in reset.reason
        assert await mine.next(timeout=0) is None  # nothing of its own missed, nothing to say
        own = _session_events("mine", 1)
        hub.publish(own)
        assert await mine.next(timeout=1) is own[0]

        unread = _session_events("mine", 1)
        hub.publish(unread)
        hub.publish(_session_events("other", 5))
        hub.publish(_session_events("other", 5))  # the unread event of its own goes with these
        reset = await mine.next(timeout=1)
        assert isinstance(reset, Reset) and "fell behind" in reset.reason

    asyncio.run(run())


def test_a_resume_to_one_session_is_reset_only_when_an_event_of_its_session_was_dropped() -> None:
    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=3)))
        own = _session_events("mine", 1)
        hub.publish(own)
        resume_at = own[0].revision
        hub.publish(_session_events("other", 5))
        hub.publish(_session_events("other", 5))  # the ring now starts long after resume_at
        assert hub.event_at(hub.first_seq).revision > resume_at + 1

        resumed = hub.subscribe("mine", resume_at)
        assert await resumed.next(timeout=0) is None  # missed nothing of its own: no reset
        later = _session_events("mine", 1)
        hub.publish(later)
        assert await resumed.next(timeout=1) is later[0]

        for session_filter in (None, "other"):  # these missed events that were dropped
            reset = await hub.subscribe(session_filter, resume_at).next(timeout=1)
            assert isinstance(reset, Reset) and "not retained" in reset.reason
        # From before its own dropped event, a resume to the session is reset too.
        reset = await hub.subscribe("mine", resume_at - 1).next(timeout=1)
        assert isinstance(reset, Reset) and "not retained" in reset.reason

    asyncio.run(run())


def test_a_resume_to_one_session_is_reset_once_too_many_sessions_had_events_dropped() -> None:
    """The hub remembers the newest dropped event of a bounded number of sessions; past them it
    remembers one revision for all, and resumes from before it are reset whatever their session."""

    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=1)))
        own = _session_events("mine", 1)
        hub.publish(own)
        for index in range(DROPPED_SESSIONS_REMEMBERED + 1):
            hub.publish(_session_events(f"s{index}", 1))
        reset = await hub.subscribe("mine", own[0].revision).next(timeout=1)
        assert isinstance(reset, Reset) and "not retained" in reset.reason

    asyncio.run(run())


def test_a_sessions_subscriber_is_not_reset_when_the_process_bound_drops_other_sessions_events() -> None:
    async def run() -> None:
        size = _session_events("other", 1)[0].size
        feeds = Feeds(FeedSettings(retain_total_bytes=4 * size))
        quiet, busy = watched(feeds.hub("o1")), watched(feeds.hub("o2"))
        mine = quiet.subscribe("mine", 0)
        quiet.publish(_session_events("other", 2))
        quiet.publish(_session_events("other", 1))  # the latest commit: kept for its subscriber
        busy.publish(_session_events("b", 3))  # the process bound drops the quiet object's first two
        assert quiet.first_seq == 2
        assert await mine.next(timeout=0) is None
        own = _session_events("mine", 1)
        quiet.publish(own)
        assert await mine.next(timeout=1) is own[0]

    asyncio.run(run())


def test_a_subscriber_that_keeps_up_gets_every_event_of_a_commit_past_retention() -> None:
    """A commit's events are published together, before any subscriber can read: a subscriber
    with nothing unread was reset by a commit of more than its queue held, then by one of more
    than retention keeps (12,000 messages in one AppendMessages, one 70 MiB message). The latest
    commit stays until the subscribers have read it; then the bounds apply again."""

    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=100, retain_bytes=1024 * 1024)))
        subscriber = hub.subscribe(None, 0)
        many = _events(5_000)
        hub.publish(many)
        assert await _drain(subscriber, 5_000) == many
        assert hub.next_seq - hub.first_seq <= 100  # read: back within the bounds
        large = [*_events(1), *_events(3, size=5 * 1024 * 1024)]
        hub.publish(large)
        assert await _drain(subscriber, 4) == large
        assert await subscriber.next(timeout=0) is None

    asyncio.run(run())


def test_a_subscriber_that_reads_no_commit_falls_behind_once_a_later_one_arrives() -> None:
    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=100)))
        stalled = hub.subscribe(None, 0)
        hub.publish(_events(500))  # kept whole while it is the latest commit
        assert hub.next_seq - hub.first_seq == 500
        later = _events(10)
        hub.publish(later)  # the earlier commit goes back within twice the bounds (being read)
        assert hub.next_seq - hub.first_seq == 200
        reset = await stalled.next(timeout=1)
        assert isinstance(reset, Reset) and "fell behind" in reset.reason
        assert await stalled.next(timeout=0) is None

    asyncio.run(run())


def test_subscribers_reading_a_large_commit_are_not_reset_by_the_next_one() -> None:
    """A commit past the bounds was spared only while it was the latest: any write after it cut
    it back to the bounds under subscribers reading it as fast as they could (a batch of 12,000
    messages, then one more append, reset all three subscribers of an object). An earlier commit
    being read is spared within twice the bounds."""

    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=100)))
        readers = [hub.subscribe(None, 0) for _ in range(3)]
        batch, after = _events(150), _events(1)
        hub.publish(batch)
        for reader in readers:
            assert await _drain(reader, 10) == batch[:10]
        hub.publish(after)
        for reader in readers:
            assert await _drain(reader, 200) == batch[10:] + after
        assert hub.next_seq - hub.first_seq <= 100  # all read: back within the bounds

    asyncio.run(run())


def test_a_reader_slower_than_its_writers_is_reset_past_twice_the_bounds() -> None:
    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=100)))
        slow = hub.subscribe(None, 0)
        hub.publish(_events(150))
        assert len(await _drain(slow, 10)) == 10
        for _ in range(10):
            hub.publish(_events(10))
        assert hub.next_seq - hub.first_seq == 200
        assert isinstance(await slow.next(timeout=1), Reset)

    asyncio.run(run())


def test_a_subscriber_that_stopped_reading_holds_nothing_back_once_stalled() -> None:
    """A subscriber that stops reading right after a large commit held that commit past every
    bound for as long as it stayed connected: six of them held 815 MiB against a process-wide
    bound of 256 MiB, and other objects' events were dropped instead (their subscribers reset).
    Once it has taken nothing for STALLED_SECONDS, what it held goes as the bounds say (the
    oldest first), looked at again by the hub's own timer even if nothing more is published."""

    async def run() -> tuple[int, list[int]]:
        feeds = Feeds(FeedSettings(retain_events=10_000, retain_bytes=10_000_000, retain_total_bytes=110_000))
        stalled_hub, busy = watched(feeds.hub("o3")), watched(feeds.hub("o4"))
        stalled = stalled_hub.subscribe(None, 0)
        stalled_hub.publish([ChangeEvent("append", "s", message_json="x" * 100_000)])
        busy.publish([ChangeEvent("append", "s", message_json="y" * 30_000)])  # past the bound
        assert len(stalled_hub._ring) == 1 and len(busy._ring) == 0  # spared: its subscriber may read it
        assert stalled_hub._recheck is not None  # the hub looks again once it would count as stalled

        stalled.active_at -= STALLED_SECONDS + 1  # as if it had taken nothing since
        stalled_hub._recheck.cancel()
        stalled_hub._look_again()  # what the timer runs
        for index in range(3):
            busy.publish([ChangeEvent("append", "s", message_json=str(index) * 20_000)])
        assert feeds.retention.bytes <= feeds.retention.max_bytes
        reset = await stalled.next(timeout=1)  # reading again, it is told what it missed
        assert isinstance(reset, Reset) and "fell behind" in reset.reason
        return len(stalled_hub._ring), [len(event.message_json or "") for event in busy._ring]

    stalled_kept, busy_kept = asyncio.run(run())
    assert stalled_kept == 0  # the oldest event in the process went first
    assert busy_kept == [20_000] * 3


def test_a_caught_up_subscriber_idle_for_long_is_not_stalled_on_a_new_commit() -> None:
    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=10)))
        idle = hub.subscribe(None, 0)
        idle.active_at -= STALLED_SECONDS + 1  # waited long for an event, with none to read
        batch = _events(50)
        hub.publish(batch)  # the latest commit, spared for it
        assert hub.next_seq - hub.first_seq == 50
        assert await _drain(idle, 50) == batch

    asyncio.run(run())


def test_hub_epochs_keep_to_the_clock_however_many_hubs_are_made() -> None:
    """One counter for every hub ran a millisecond ahead per hub made: 20,000 subscriptions in
    8 s put it 12 s ahead, and after a restart an object's revisions went below those it had."""
    started = time.time() * 1000
    hubs = [watched(FeedHub()) for _ in range(20_000)]
    assert max(hub.epoch for hub in hubs) <= time.time() * 1000 + 1
    assert min(hub.epoch for hub in hubs) >= int(started)


def test_an_objects_next_hub_starts_above_its_last_within_one_millisecond(tmp_path: Path) -> None:
    async def run() -> list[tuple[int, int]]:
        registry = ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=1))
        hubs = []
        for _ in range(200):  # each let go at once (no store, no subscriber): made again
            async with registry.feed("k") as hub:
                hub.publish(_events(1))
                hubs.append((hub.start_revision, hub.revision))
        return hubs

    started = time.time() * 1000
    hubs = asyncio.run(run())
    revisions = [revision for pair in hubs for revision in pair]
    assert revisions == sorted(set(revisions))  # strictly increasing, however fast
    # ...without running ahead of the clock (one epoch a hub ran a millisecond ahead per hub).
    assert int(started) <= hubs[0][0] >> 22 <= hubs[-1][1] >> 22 <= time.time() * 1000 + 1


def test_a_subscriber_holds_no_events_of_its_own() -> None:
    """A subscriber pins nothing of its own: what the ring drops is gone, and it is told so."""

    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=2)))
        first = _events(3)
        hub.publish(first)
        stalled = hub.subscribe(None, first[0].revision)  # resumed: the ring's two follow it
        hub.publish(_events(4))  # the ring moves on past both (twice its bounds)
        assert not any(vars(stalled).get(name) for name in ("backlog", "_queue"))
        reset = await stalled.next(timeout=1)
        assert isinstance(reset, Reset) and "fell behind" in reset.reason

    asyncio.run(run())


def test_a_restart_is_an_unknown_revision() -> None:
    async def run() -> None:
        before = watched(FeedHub())
        old = _events(2)
        before.publish(old)
        # Reopened (a feed made later takes revisions above every earlier one's, even within the
        # same millisecond), or restarted (the clock has moved on).
        after = watched(FeedHub())
        after.publish(_events(1))
        assert after.revision > old[-1].revision
        item = await after.subscribe(None, old[-1].revision).next(timeout=1)
        assert isinstance(item, Reset) and "restarted" in item.reason
        future = await after.subscribe(None, after.revision + (1 << 40)).next(timeout=1)
        assert isinstance(future, Reset)

    asyncio.run(run())


def test_an_event_queued_while_a_wait_times_out_is_delivered_not_reported_as_nothing() -> None:
    # The caller answers a timed-out wait with progress at the hub's current revision; an event
    # queued as the timed-out wait was torn down (another writer's commit, one loop turn later)
    # must come first, or a resume from that progress revision would skip it.
    async def run() -> None:
        hub = watched(FeedHub())
        subscription = hub.subscribe(None, 0)
        late = ChangeEvent("append", "", message_json="{}")

        class PublishesAsTheWaitIsCancelled(asyncio.Event):
            async def wait(self) -> Literal[True]:
                try:
                    return await super().wait()
                except asyncio.CancelledError:
                    if not late.revision:  # once
                        hub.publish([late])
                    raise

        subscription._wakeup = PublishesAsTheWaitIsCancelled()
        assert await subscription.next(timeout=0.01) is late
        assert await subscription.next(timeout=0.01) is None  # now nothing: progress is exact

    asyncio.run(run())


def test_events_are_counted_at_what_their_texts_take_in_memory_or_in_utf8() -> None:
    """UTF-8 for text that takes less in memory (its encoding is what subscribers are sent), the
    memory for text that takes more: one emoji makes CPython keep 4 bytes a character."""
    wide = "é" * 100_000  # 100,000 characters, 200,000 bytes of UTF-8, 1 byte a character held
    assert ChangeEvent("append", "", message_json=wide).size >= 200_000
    mostly_ascii = "x" * 100_000 + "😀"  # 100,004 bytes of UTF-8, 4 bytes a character held
    assert ChangeEvent("append", "", message_json=mostly_ascii).size >= 400_004
    assert ChangeEvent("delete", "", message_ids=(mostly_ascii,), error=wide).size >= 600_004


def test_a_compaction_event_counts_its_summary() -> None:
    """Its record travels with it: 150 compactions of 3 MiB summaries were each counted at 256
    bytes, so the ring kept them all (RSS +525 MiB, kept after the writes)."""
    record = Compaction("c1", 1, "s" * 3_000_000, "m1", "m9", 0)
    assert ChangeEvent("compaction", "", compaction=record).size >= 3_000_000


def test_retention_by_bytes_counts_what_events_take() -> None:
    emoji = '{"text":"' + "😀" * 1000 + '"}'
    event = ChangeEvent("append", "", message_json=emoji)
    hub = watched(FeedHub(FeedSettings(retain_bytes=2 * event.size)))
    events = [ChangeEvent("append", "", message_json=emoji) for _ in range(3)]
    hub.publish(events)

    async def resume() -> ChangeEvent | Reset | None:
        return await hub.subscribe(None, events[0].revision - 1).next(timeout=1)

    assert isinstance(asyncio.run(resume()), Reset)  # three do not fit in two's bytes


def _kept_from(hub: FeedHub, after: int) -> list[ChangeEvent | Reset]:
    """Everything a subscriber resuming after revision `after` is given at once."""

    async def drain() -> list[ChangeEvent | Reset]:
        subscription = hub.subscribe(None, after)
        items = []
        while (item := await subscription.next(timeout=0)) is not None:
            items.append(item)
        subscription.close()
        return items

    return asyncio.run(drain())


def test_open_objects_keep_events_within_one_bound_for_the_process_oldest_first() -> None:
    size = _events(1)[0].size
    feeds = Feeds(FeedSettings(retain_total_bytes=4 * size))
    first, second = watched(feeds.hub("o5")), watched(feeds.hub("o6"))
    early, late = _events(3), _events(3)
    first.publish(early)
    second.publish(late[:1])  # four kept: within the bound
    assert _kept_from(first, early[0].revision - 1) == early
    second.publish(late[1:])  # six: the two oldest in the process go, both the first object's
    assert feeds.retention.bytes == 4 * size
    reset = _kept_from(first, early[0].revision - 1)
    assert len(reset) == 1 and isinstance(reset[0], Reset) and "not retained" in reset[0].reason
    assert _kept_from(first, early[1].revision) == early[2:]
    assert _kept_from(second, late[0].revision - 1) == late


def test_events_a_feed_drops_or_closes_on_are_no_longer_counted_for_the_process() -> None:
    size = _events(1)[0].size
    feeds = Feeds(FeedSettings(retain_events=2, retain_total_bytes=100 * size))
    busy, closing = watched(feeds.hub("o7")), watched(feeds.hub("o8"))
    for event in _events(5_000):
        busy.publish([event])  # the object's own bound keeps two
    assert feeds.retention.bytes == 2 * size
    # What the process bound tracks of events the hubs dropped themselves stays bounded too.
    assert len(feeds.retention._order) <= 2 * 2 + 1024
    closing.publish(_events(2))
    assert feeds.retention.bytes == 4 * size
    closing.close_all(FeedClosed("the object closed"))
    assert feeds.retention.bytes == 2 * size
    closing.publish(_events(1))  # published while its object finishes closing: kept for nobody
    assert feeds.retention.bytes == 2 * size


def test_the_process_bound_keeps_no_closed_objects_hub() -> None:
    """Each object evicted and reopened closes its hub; what the process bound tracks of the
    closed hub's events held the hub itself until a sweep, which a feed keeping many events
    put off for as many evictions, and an idle server for good."""
    feeds = Feeds(FeedSettings(retain_events=10_000, retain_total_bytes=10_000_000))
    busy = watched(feeds.hub("o9"))
    busy.publish(_events(5_000))
    closed: list[weakref.ref[FeedHub]] = []
    for _ in range(1_000):
        hub = watched(feeds.hub("o10"))
        hub.publish(_events(1))
        hub.close_all(FeedClosed("the object closed"))
        closed.append(weakref.ref(hub))
    del hub
    assert feeds.retention.bytes == 5_000 * _events(1)[0].size
    assert [ref for ref in closed if ref() is not None] == []
    busy.publish(_events(1))  # the process bound goes on with the closed hubs' entries gone
    assert len(busy._ring) == 5_001


def test_an_event_spared_by_the_process_bound_is_dropped_once_read() -> None:
    """The process-wide bound spares an object's latest commit while a subscriber has still to
    read it, and must still count it afterwards: it forgot the event, which then stayed past the
    bound for good (its object quiet) while other objects' newer events were dropped instead."""

    async def run() -> tuple[list[int], list[int]]:
        feeds = Feeds(FeedSettings(retain_events=10_000, retain_bytes=10_000_000, retain_total_bytes=110_000))
        quiet, busy = watched(feeds.hub("o11")), watched(feeds.hub("o12"))
        reader = quiet.subscribe(None, 0)
        quiet.publish([ChangeEvent("append", "s", message_json="x" * 60_000)])  # unread: spared
        busy.publish([ChangeEvent("append", "s", message_json="y" * 50_000)])
        assert isinstance(await reader.next(timeout=1), ChangeEvent)  # read now; `quiet` publishes nothing more
        for index in range(5):
            busy.publish([ChangeEvent("append", "s", message_json=str(index) * 20_000)])
        return [len(event.message_json or "") for event in quiet._ring], [
            len(event.message_json or "") for event in busy._ring
        ]

    quiet_kept, busy_kept = asyncio.run(run())
    assert quiet_kept == []  # the oldest event in the process went first
    assert busy_kept == [20_000] * 5


def test_a_feed_nobody_subscribed_to_keeps_no_events_until_someone_does() -> None:
    """Its revisions reach callers through subscriptions alone: before the first, nothing can
    resume, and an object nobody watched kept up to --feed-retain-bytes of event text."""

    async def run() -> None:
        feeds = Feeds(FeedSettings(retain_total_bytes=10_000_000))
        hub = feeds.hub("o13")
        unwatched = _events(5, size=1000)
        hub.publish(unwatched)
        assert feeds.retention.bytes == 0
        assert [e.revision for e in unwatched] == sorted({e.revision for e in unwatched})
        assert hub.revision == unwatched[-1].revision  # revisions go on all the same
        live = hub.subscribe(None, 0)
        watched_events = _events(2, size=1000)
        hub.publish(watched_events)
        assert await _drain(live, 2) == watched_events
        assert feeds.retention.bytes >= 2 * 1000
        live.close(FeedClosed("done"))
        resumed = await _drain(hub.subscribe(None, watched_events[0].revision), 1)
        assert resumed == watched_events[1:]  # kept for a resume once someone subscribed

    asyncio.run(run())


def test_a_resume_from_before_the_first_subscriber_is_reset() -> None:
    async def run() -> None:
        hub = FeedHub()
        events = [ChangeEvent("append", session, message_json="x") for session in ("a", "b", "a")]
        hub.publish(events)
        for session_filter in (None, "a", "b"):
            first = await hub.subscribe(session_filter, events[0].revision).next(timeout=1)
            assert isinstance(first, Reset) and "not retained" in first.reason, session_filter

    asyncio.run(run())


def test_a_subscriber_being_sent_a_large_event_is_given_time_for_it() -> None:
    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=10)))
        reader = hub.subscribe(None, 0)
        large = ChangeEvent("append", "", message_json="x" * (100 * 1024 * 1024))
        hub.publish([large])
        assert await reader.next(timeout=0) is large
        reader.active_at -= STALLED_SECONDS + 60  # a minute past the rule, 100 MiB being sent
        assert not reader.stalled(time.monotonic())
        reader.active_at -= 60
        assert reader.stalled(time.monotonic())

    asyncio.run(run())
