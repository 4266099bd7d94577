"""Revisions of the feed hubs of a process: every feed's are its own, so a revision of one
object's feed is unknown to another's (two feeds made in one millisecond once shared an epoch,
and a revision of one resumed on the other, silently skipping events); they increase across an
object's feeds and keep to the clock however many feeds are made; and a feed recognises its own
across the blocks it takes them in."""

from __future__ import annotations

import asyncio
import time

from sessions_server.storage import feed
from sessions_server.storage.feed import COUNTER_BITS, ChangeEvent, FeedClosed, FeedHub, Feeds, FeedSettings, Reset
from tests.storage.test_feed_hub import watched


def _events(count: int, session_id: str = "") -> list[ChangeEvent]:
    return [ChangeEvent("append", session_id, message_json="{}") for _ in range(count)]


async def _first(hub: FeedHub, after: int, session_filter: str | None = None) -> ChangeEvent | Reset | None:
    subscription = hub.subscribe(session_filter, after)
    try:
        return await subscription.next(timeout=0)
    finally:
        subscription.close()


def _same_millisecond_pair(feeds: Feeds) -> tuple[FeedHub, FeedHub]:
    """Two hubs made one after the other within one millisecond (so in one epoch)."""
    for _ in range(1_000):
        first, second = watched(feeds.hub("o1")), watched(feeds.hub("o2"))
        if first.epoch == second.epoch:
            return first, second
    raise AssertionError("no two hubs made within one millisecond in 1,000 tries")


def test_a_revision_of_a_feed_made_in_the_same_millisecond_is_unknown_to_another() -> None:
    async def run() -> None:
        feeds = Feeds()
        one, other = _same_millisecond_pair(feeds)
        one_start, other_start = one.revision, other.revision  # what a subscriber is told before any event
        mine, theirs = _events(3), _events(6)
        one.publish(mine)
        other.publish(theirs)
        assert not {e.revision for e in mine} & {e.revision for e in theirs}
        assert one_start != other_start

        for hub, foreign in ((other, mine[1].revision), (other, one_start), (one, theirs[1].revision)):
            for session_filter in (None, ""):  # a session's resume too (it may pass from before the ring)
                item = await _first(hub, foreign, session_filter)
                assert isinstance(item, Reset), (hub is one, foreign, item)
        # Its own it still resumes from.
        assert await _first(other, theirs[1].revision) is theirs[2]
        assert await _first(one, one_start) is mine[0]

    asyncio.run(run())


def test_every_revision_handed_out_in_the_process_is_unique_and_keeps_to_the_clock() -> None:
    started = time.time() * 1000
    feeds = Feeds()
    hubs = [watched(feeds.hub("o3")) for _ in range(5_000)]
    handed_out = [hub.revision for hub in hubs]  # their starts
    for hub in hubs[::50]:
        events = _events(3)
        hub.publish(events)
        handed_out += [e.revision for e in events]
    assert len(set(handed_out)) == len(handed_out)
    epochs = [revision >> COUNTER_BITS for revision in handed_out]
    assert int(started) <= min(epochs) and max(epochs) <= time.time() * 1000 + 1


def test_a_feed_knows_its_revisions_across_its_blocks_and_not_those_between() -> None:
    """A busy feed takes a new block every BLOCK - 1 events; another feed's block may lie between
    two of its own, and a revision there is not its."""

    block = feed.BLOCK

    async def run() -> None:
        feeds = Feeds(FeedSettings(retain_events=3 * block, retain_total_bytes=1 << 40))
        busy = watched(feeds.hub("o4"))
        first = _events(block)
        busy.publish(first)  # past its first block
        between = watched(feeds.hub("o5"))  # its block comes after the busy feed's second
        theirs = _events(2)
        between.publish(theirs)
        second = _events(block)
        busy.publish(second)  # a third block, after the other feed's
        events = first + second
        revisions = [e.revision for e in events]
        assert revisions == sorted(set(revisions))
        assert revisions[0] < theirs[0].revision < revisions[-1]
        assert not busy.knows(theirs[0].revision)
        assert all(busy.knows(revision) for revision in revisions)

        for index in (0, block - 2, block - 1, block, len(events) - 2):  # around block boundaries
            subscription = busy.subscribe(None, events[index].revision)
            replay = []
            while (item := await subscription.next(timeout=0)) is not None:
                replay.append(item)
            subscription.close()
            assert replay == events[index + 1 :], index
        assert isinstance(await _first(busy, theirs[1].revision), Reset)
        assert isinstance(await _first(busy, theirs[1].revision, ""), Reset)

    asyncio.run(run())


def test_a_revision_ahead_of_the_feed_is_reset_to_the_feeds_revision() -> None:
    async def run() -> None:
        hub = watched(Feeds().hub("o"))
        hub.publish(_events(2))
        reset = await _first(hub, hub.revision + (1 << 30))
        assert isinstance(reset, Reset) and reset.revision == hub.revision

    asyncio.run(run())


def test_a_feed_start_is_remembered_for_its_object_while_the_feed_carried_no_event() -> None:
    """What lets a resume from the start of a feed that carried no event start where a later feed
    of the object started (`SessionsService.subscribe`): forgotten once a feed of the object
    carried an event (then the resume would miss it, also from the start of a feed before that
    one) or was closed by a move; the newest few thousand kept."""
    feeds = Feeds()
    starts = feeds.quiet_starts
    quiet, carried, moved, after_close = hubs = [watched(feeds.hub(f"k{index}")) for index in range(4)]
    for index, hub in enumerate(hubs):
        starts.note(hub.start_revision, f"k{index}")
    earlier = watched(feeds.hub("k1"))  # a feed of k1's before the one that carries an event
    starts.note(earlier.start_revision, "k1")
    earlier.close_all(FeedClosed("the object closed"))
    assert starts.key_of(earlier.start_revision) == "k1"
    carried.publish(_events(1))
    for hub in (quiet, carried, after_close):
        hub.close_all(FeedClosed("the object closed"))
    moved.close_all(FeedClosed("the object is being replaced or removed", moving=True))
    after_close.publish(_events(1))  # a write committed as its object closed: told to nobody

    assert starts.key_of(quiet.start_revision) == "k0"
    assert [starts.key_of(hub.start_revision) for hub in (carried, moved, after_close, earlier)] == [None] * 4
    for index in range(feed.QUIET_STARTS_REMEMBERED):
        starts.note(-1 - index, "other")
    assert starts.key_of(quiet.start_revision) is None  # the oldest went
