"""The process-wide bound on retained events (`FeedRetention`) costs O(1) per event kept, while
it spares the latest commit of an object that a subscriber has still to read: it walked every
spared event again at each event kept anywhere, so publishing one commit of N events took
O(N²) (4,000 events: 12 s) and, while the subscriber had not read it, every event published
anywhere in the process cost O(N). What it spares still goes once read, oldest first.

The cost is counted, not timed: how often the bound asks a hub what of its latest commit may go
(`_droppable_before`), once per spared event at each event kept, before."""

from __future__ import annotations

import asyncio

import pytest

from sessions_server.storage.feed import ChangeEvent, FeedHub, Feeds, FeedSettings, Reset, Subscription
from tests.storage.test_feed_hub import watched

BUDGET = 256 * 1024
COMMIT = 4_000


def _events(count: int, fill: str = "x", size: int = 500) -> list[ChangeEvent]:
    return [ChangeEvent("append", "s", message_json=fill * size) for _ in range(count)]


def _questions(monkeypatch: pytest.MonkeyPatch, later_events: int) -> tuple[int, int]:
    """How often hubs were asked what of their latest commit may go, while a commit of COMMIT
    events, past the bound, was published to a hub whose subscriber has not read it, and then
    while `later_events` events were published to another hub."""
    asked = [0]
    real = FeedHub._droppable_before

    def counted(hub: FeedHub) -> int:
        asked[0] += 1
        return real(hub)

    monkeypatch.setattr(FeedHub, "_droppable_before", counted)
    feeds = Feeds(FeedSettings(retain_events=10**6, retain_bytes=10**12, retain_total_bytes=BUDGET))
    hub, other = watched(feeds.hub("o1")), watched(feeds.hub("o2"))
    hub.subscribe(None, 0)
    commit = _events(COMMIT)
    hub.publish(commit)
    during_commit = asked[0]
    for event in _events(later_events, "y"):  # every event published anywhere while the commit is unread
        other.publish([event])
    assert feeds.retention.bytes >= COMMIT * commit[0].size  # spared whole for its reader
    return during_commit, asked[0] - during_commit


def test_publishing_a_commit_its_subscriber_has_still_to_read_costs_o1_an_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    during_commit, _ = _questions(monkeypatch, later_events=0)
    assert during_commit <= 4 * COMMIT, during_commit  # was about COMMIT² / 2 (8 million)


def test_while_a_commit_is_unread_an_event_anywhere_costs_o1(monkeypatch: pytest.MonkeyPatch) -> None:
    _, during_later = _questions(monkeypatch, later_events=2_000)
    assert during_later <= 4 * 2_000, during_later  # was about COMMIT at each (8 million)


def test_a_spared_commit_goes_once_read_while_the_bound_is_exceeded_then_the_oldest_first() -> None:
    async def run() -> None:
        size = _events(1)[0].size
        feeds = Feeds(FeedSettings(retain_events=10**6, retain_bytes=10**12, retain_total_bytes=100 * size))
        hub, other = watched(feeds.hub("o3")), watched(feeds.hub("o4"))
        reader = hub.subscribe(None, 0)
        commit = _events(300)
        hub.publish(commit)  # three times the budget: spared whole for its reader
        assert feeds.retention.bytes == 300 * size
        for index, event in enumerate(commit):
            assert await reader.next(timeout=0) is event
            # Each read lets its event go while the bound is exceeded; the rest stays.
            assert feeds.retention.bytes == max(100, 300 - index - 1) * size
        assert await reader.next(timeout=0) is None
        assert hub.next_seq - hub.first_seq == 100  # the newest hundred: within the budget

        # What is left is the oldest: another object's events push it out first, one by one.
        later = _events(40, "y")
        for index, event in enumerate(later):
            other.publish([event])
            assert hub.next_seq - hub.first_seq == 100 - index - 1
            assert other.next_seq - other.first_seq == index + 1
        item = await hub.subscribe(None, commit[0].revision).next(timeout=0)
        assert isinstance(item, Reset) and "not retained" in item.reason

    asyncio.run(run())


def test_a_spared_commit_read_within_the_budget_waits_in_the_bounds_order_as_the_oldest() -> None:
    """Read once the bound had room again (other objects' events dropped in its place), the spared
    events are kept, and still go first when the bound next needs room."""

    async def run() -> None:
        size = _events(1)[0].size
        feeds = Feeds(FeedSettings(retain_events=10**6, retain_bytes=10**12, retain_total_bytes=10 * size))
        hub, other, third = watched(feeds.hub("o5")), watched(feeds.hub("o6")), watched(feeds.hub("o7"))
        reader = hub.subscribe(None, 0)
        commit = _events(8)
        hub.publish(commit)  # within the budget
        other_events = _events(4, "y")
        other.publish(other_events)  # past it: the commit is spared, two of these go instead
        assert (hub.next_seq - hub.first_seq, other.next_seq - other.first_seq) == (8, 2)
        for event in commit:  # read: the bound is within its budget, so they stay...
            assert await reader.next(timeout=0) is event
        assert feeds.retention.bytes == 10 * size
        third.publish(_events(3, "z"))  # ...and are the first to go when it needs room
        assert (hub.next_seq - hub.first_seq, other.next_seq - other.first_seq) == (5, 2)

    asyncio.run(run())


def test_events_of_a_closed_hub_that_still_owed_them_are_no_longer_counted() -> None:
    size = _events(1)[0].size
    feeds = Feeds(FeedSettings(retain_events=10**6, retain_bytes=10**12, retain_total_bytes=10 * size))
    hub = watched(feeds.hub("o8"))
    hub.subscribe(None, 0)
    hub.publish(_events(30))  # spared for the subscriber
    assert feeds.retention.bytes == 30 * size
    hub.close_all(_closed())
    assert feeds.retention.bytes == 0
    other: FeedHub = watched(feeds.hub("o9"))
    other.publish(_events(12))
    assert feeds.retention.bytes == 10 * size


def _closed():  # type: ignore[no-untyped-def]
    from sessions_server.storage.feed import FeedClosed

    return FeedClosed("the object closed")


def test_subscribers_reading_a_commit_past_the_bounds_look_at_one_another_once_an_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the ring is past its bounds, every read asks where the slowest subscriber still
    reading stands, and finding it looks at every subscriber: N subscribers reading E events
    looked N²E times (200 reading 12,000: about a minute of the event loop). The position is
    kept until every subscriber standing there has moved on: looked for once an event."""
    looked = [0]
    real = Subscription.stalled

    def counted(subscriber: Subscription, now: float) -> bool:
        looked[0] += 1
        return real(subscriber, now)

    monkeypatch.setattr(Subscription, "stalled", counted)
    readers, events = 50, 150

    async def run() -> None:
        hub = watched(FeedHub(FeedSettings(retain_events=100)))
        subscribers = [hub.subscribe(None, 0) for _ in range(readers)]
        hub.publish(_events(events))
        hub.publish(_events(1))  # the batch is no longer the latest commit: spared while read
        for _ in range(events + 1):
            for subscriber in subscribers:
                assert isinstance(await subscriber.next(timeout=0), ChangeEvent)

    asyncio.run(run())
    assert looked[0] <= 2 * readers * (events + 1)
