"""The change feed of one object: revisions, retention, and subscribers (DESIGN.md §6).

Events are published by the object's writer only after their transaction committed, in commit
order, so revisions follow commit order across all writers. Each event gets a revision that
increases for the life of the object: `epoch << 22 | counter`, where the epoch is a millisecond
clock taken when the object opens (and moved on if the counter ever fills), so revisions keep
increasing across restarts while a resume point from before a restart is recognisably gone.

A bounded ring keeps recent events (by count and bytes), and one bound for the process
(`FeedRetention`) keeps the rings of all objects together within a budget, the oldest event
going first whichever object it belongs to. A subscriber is a place in the ring: it reads the
events after it in order, and publishing only wakes it, never waits for it. A subscriber
resuming from before what the ring keeps, or one so slow that the ring drops an event it has
not read, is told to reset (a subscriber to one session, only when such an event was of its
session); a slow reader never slows writers or other readers, and holds no events of its own.
"""

from __future__ import annotations

import asyncio
import bisect
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

from sessions_server.storage.rows import Compaction, RowInfo, held_bytes

COUNTER_BITS = 22
COUNTER_LIMIT = 1 << COUNTER_BITS
DEFAULT_RETAIN_EVENTS = 10_000
DEFAULT_RETAIN_BYTES = 64 * 1024 * 1024
DEFAULT_RETAIN_TOTAL_BYTES = 256 * 1024 * 1024
# Sessions whose newest dropped event a hub remembers for resuming subscribers to one session;
# past it, it remembers one revision for them all (as if every session had had that event).
# About 200 bytes each: at most ~50 KB a hub, ~13 MB with 256 objects open.
DROPPED_SESSIONS_REMEMBERED = 256


@dataclass(frozen=True)
class FeedSettings:
    """Retention of an object's recent events (for resuming subscribers, and those that fall
    behind), and of all objects' together."""

    retain_events: int = DEFAULT_RETAIN_EVENTS
    retain_bytes: int = DEFAULT_RETAIN_BYTES
    retain_total_bytes: int = DEFAULT_RETAIN_TOTAL_BYTES


@dataclass(slots=True)
class ChangeEvent:
    """One change, as upstream's listeners see it, plus its revision (set when published)."""

    type: str
    session_id: str
    message_json: str | None = None
    message_info: RowInfo | None = None
    inserted: bool = False
    parent_kind: str = ""  # append: "auto", "root" or "id" (the option as passed); import: "id"/"root"
    parent_id: str = ""
    message_ids: tuple[str, ...] = ()
    compaction: Compaction | None = None
    error: str = ""
    revision: int = 0

    _size: int = field(default=-1, init=False, repr=False, compare=False)  # see `size`

    @property
    def size(self) -> int:
        """Bytes the event is counted at: what its texts take (`held_bytes`: in memory, or in
        UTF-8 once encoded for subscribers), a compaction's summary included, and a fixed
        overhead (computed once: the ring's retention and the feed's framing both count it)."""
        if self._size < 0:
            texts = [self.message_json or "", self.error, *self.message_ids]
            if self.compaction is not None:
                record = self.compaction
                texts += (record.summary, record.id, record.from_message_id, record.to_message_id)
            self._size = 256 + sum(map(held_bytes, texts))
        return self._size


class FeedClosed(Exception):
    """The object's feed closed (server shutdown, the object replaced or removed): the
    subscriber should reconnect. `moving`: the object is being replaced or removed, not the
    server stopping."""

    def __init__(self, why: str, *, moving: bool = False) -> None:
        super().__init__(why)
        self.moving = moving


@dataclass(frozen=True, slots=True)
class Reset:
    """The subscriber missed events: it should re-read state; the feed continues live after it."""

    revision: int
    reason: str


class Subscription:
    """A subscriber's place in its object's retained events (as etcd's watchers keep theirs):
    it holds no events of its own, reads them from the ring in order, and falls behind only when
    the ring drops one it has not read and would deliver (retention; one of another session's
    passes a session's subscriber by), which it is told as a Reset. So a subscriber
    that keeps up receives any commit, however many or large its events, and one that stalls
    holds nothing. Iterate with `next()`; close with `close()`."""

    def __init__(self, hub: FeedHub, session_filter: str | None, start: int) -> None:
        self._hub = hub
        self.session_filter = session_filter
        self._next = start  # sequence number (see FeedHub) of the next event to look at
        self._reset: Reset | None = None  # told before anything else
        self._interrupted = False  # `next` returns None once, as when its wait times out
        self._wakeup = asyncio.Event()
        self.closed: FeedClosed | None = None

    def wants(self, event: ChangeEvent) -> bool:
        return self.session_filter is None or event.session_id == self.session_filter

    @property
    def position(self) -> int:
        """The sequence number of the next event it will look at."""
        return self._next

    def skip_to(self, seq: int) -> None:
        """Places it at `seq`, having passed over what lay before (none of it for this subscriber)."""
        self._next = seq

    def wake(self) -> None:
        self._wakeup.set()

    def interrupt(self) -> None:
        """Makes `next` return None at once if it has nothing to deliver (its caller then looks
        at its own state, a revoked grant say, without waiting for the next event)."""
        self._interrupted = True
        self._wakeup.set()

    def _take(self) -> ChangeEvent | Reset | None:
        """The next thing to deliver, if any, moving the position past what it passes over."""
        if self._reset is not None:
            reset, self._reset = self._reset, None
            return reset
        hub = self._hub
        if self._next < hub.first_seq:
            self._next = hub.next_seq
            return Reset(hub.revision, "the subscriber fell behind: events it had not read were no longer retained")
        while self._next < hub.next_seq:
            event = hub.event_at(self._next)
            self._next += 1
            if self.wants(event):
                hub.trim()
                return event
        hub.trim()
        return None

    async def next(self, timeout: float | None = None) -> ChangeEvent | Reset | None:
        """The next event, or None when `timeout` passed with nothing to deliver (then nothing
        up to the hub's current revision is for this subscriber)."""
        while True:
            if self.closed is not None:
                raise FeedClosed(str(self.closed), moving=self.closed.moving)
            self._wakeup.clear()
            item = self._take()
            if item is not None:
                return item
            if self._interrupted:
                self._interrupted = False
                return None
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                # An event may have been published while the timed-out wait was torn down: the
                # caller reports "nothing happened up to the current revision" only if not.
                item = None if self.closed is not None else self._take()
                if item is None and self.closed is None:
                    return None
                if item is not None:
                    return item

    def close(self, why: FeedClosed | None = None) -> None:
        """Ends the subscription: `next` raises `why` from now on."""
        self.closed = why or FeedClosed("the subscription ended")
        self._hub.unsubscribe(self)
        self._wakeup.set()


def _next_epoch(after: int = 0) -> int:
    """The millisecond clock, or `after + 1` if that is later: `after` is the epoch the object's
    previous hub had (closed and made again within the same millisecond). Only the object's own
    epochs matter: one shared counter for all objects ran ahead of the clock by a millisecond
    for every hub made (12 s after 20,000 subscriptions in 8 s), and a restart then gave an
    object revisions below, or equal to, those it had before."""
    return max(int(time.time() * 1000), after + 1)


class FeedHub:
    """Revisions, the retention ring and the subscribers of one object."""

    def __init__(
        self, settings: FeedSettings | None = None, retention: FeedRetention | None = None, *, after_epoch: int = 0
    ) -> None:
        settings = settings or FeedSettings()
        self._retention = retention
        self._epoch = _next_epoch(after_epoch)
        self._counter = 0
        self._ring: deque[ChangeEvent] = deque()
        self._ring_sizes: deque[int] = deque()  # each ring event's `size`, computed once
        self._ring_bytes = 0
        # Every event published gets the next sequence number (unlike revisions, they run on
        # through an epoch change): the ring holds those from `first_seq` to `next_seq - 1`.
        self.first_seq = 0
        self.next_seq = 0
        self._latest_from = 0  # the first sequence number of the latest commit
        self._retain_events = settings.retain_events
        self._retain_bytes = settings.retain_bytes
        self._subscribers: set[Subscription] = set()
        self._closed: FeedClosed | None = None
        # The revision of each session's newest dropped event, and one for every session
        # forgotten when there were too many: what a resume to one session may have missed.
        self._dropped: dict[str, int] = {}
        self._dropped_floor = 0

    @property
    def revision(self) -> int:
        """The revision of the newest event (the epoch's zero point before any)."""
        return (self._epoch << COUNTER_BITS) | self._counter

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, events: list[ChangeEvent]) -> None:
        """Assigns revisions, retains, and delivers; call only after the events' commit.

        The events of the latest commit stay until every subscriber has read past them, even
        past the retention bounds: a commit larger than those (a batch of 12,000 messages, one
        70 MiB message, a group commit of many batches) would otherwise be dropped before any
        subscriber could read it, resetting them all. Older events go as the bounds say."""
        ring, sizes = self._ring, self._ring_sizes
        self._latest_from = self.next_seq
        for event in events:
            self._counter += 1
            if self._counter >= COUNTER_LIMIT:
                self._epoch = _next_epoch(self._epoch)
                self._counter = 1
            event.revision = self.revision
            if self._closed is not None:  # no subscriber now or later: nothing to keep
                continue
            size = event.size
            ring.append(event)
            sizes.append(size)
            self.next_seq += 1
            self._ring_bytes += size
            self.trim()
            if self._retention is not None:
                self._retention.kept(self, event.revision, size)
        for subscriber in self._subscribers:
            subscriber.wake()

    def subscribe(self, session_filter: str | None, resume_after: int) -> Subscription:
        """A new subscriber, placed after the retained event of `resume_after` (0: live only),
        or told first to reset when the events after it are no longer (or never were) kept."""
        if self._closed is not None:
            raise FeedClosed(str(self._closed), moving=self._closed.moving)
        subscription = Subscription(self, session_filter, self.next_seq)
        if resume_after:
            current = self.revision
            oldest_kept = self._ring[0].revision if self._ring else current + 1
            same_epoch = resume_after >> COUNTER_BITS == self._epoch
            if not same_epoch and resume_after < current and resume_after >= oldest_kept - 1:
                same_epoch = True  # the counter rolled into a new epoch while we kept its events
            if resume_after > current:
                subscription._reset = Reset(
                    current, "unknown revision (the feed restarted: the object was reopened or the server restarted)"
                )
            elif not same_epoch or (
                resume_after < oldest_kept - 1 and not self._kept_all_after(session_filter, resume_after)
            ):
                reason = (
                    "events were not retained"
                    if same_epoch
                    else "the feed restarted (the object was closed and reopened, or the server restarted)"
                )
                subscription._reset = Reset(current, reason)
            else:  # just after the last kept event at or before it (revisions increase along the ring)
                revisions = [event.revision for event in self._ring]
                subscription._next = self.first_seq + bisect.bisect_right(revisions, resume_after)
        self._subscribers.add(subscription)
        return subscription

    def _kept_all_after(self, session_filter: str | None, revision: int) -> bool:
        """Whether every event of `session_filter`'s session after `revision` is still in the ring
        (none of them was dropped); for all sessions, never once the ring dropped past it."""
        if session_filter is None:
            return False
        return revision >= max(self._dropped_floor, self._dropped.get(session_filter, 0))

    def interrupt_all(self) -> None:
        for subscriber in self._subscribers:
            subscriber.interrupt()

    def event_at(self, seq: int) -> ChangeEvent:
        """The retained event of sequence number `seq` (first_seq <= seq < next_seq)."""
        return self._ring[seq - self.first_seq]

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)

    def close_all(self, why: FeedClosed) -> None:
        """Ends every subscription with `why`, and refuses later ones with it."""
        self._closed = why
        while self._ring:
            self._drop_oldest()
        for subscription in list(self._subscribers):
            subscription.close(why)

    def _drop_oldest(self) -> ChangeEvent:
        event = self._ring.popleft()
        self.first_seq += 1
        dropped = self._dropped
        dropped[event.session_id] = event.revision
        if len(dropped) > DROPPED_SESSIONS_REMEMBERED:
            dropped.clear()
            self._dropped_floor = event.revision
        size = self._ring_sizes.popleft()
        self._ring_bytes -= size
        if self._retention is not None:
            self._retention.released(size)
        return event

    def keeps(self, revision: int) -> bool:
        """Whether the ring still holds the event of `revision` (one this hub published)."""
        return bool(self._ring) and self._ring[0].revision <= revision

    def drop_through(self, revision: int) -> None:
        """Drops the retained events up to `revision` (the process-wide bound's decision), but
        none of the latest commit a subscriber has still to read."""
        ring, limit = self._ring, self._droppable_before()
        dropped: list[ChangeEvent] = []
        while ring and ring[0].revision <= revision and self.first_seq < limit:
            dropped.append(self._drop_oldest())
        self._carry_past(dropped)

    def _droppable_before(self) -> int:
        """Events before this sequence number may be dropped: those of earlier commits, and
        those of the latest commit that every subscriber has read past."""
        slowest = min((subscriber.position for subscriber in self._subscribers), default=self.next_seq)
        return max(self._latest_from, slowest)

    def trim(self) -> None:
        """Drops the oldest events while the ring is past its bounds, sparing what subscribers
        have still to read of the latest commit (which may take it past them). Runs as events
        arrive and as subscribers read."""
        if not self._past_bounds():
            return
        limit = self._droppable_before()
        dropped: list[ChangeEvent] = []
        while self._ring and self._past_bounds() and self.first_seq < limit:
            dropped.append(self._drop_oldest())
        self._carry_past(dropped)

    def _carry_past(self, dropped: list[ChangeEvent]) -> None:
        """Moves a session's subscriber that had not reached `dropped` (the events just dropped,
        oldest first) past them when none was for its session: it would have passed over them
        unread, so it has missed nothing, and a reset would send it to re-read its session for
        other sessions' traffic. One that wanted any of them is left behind, to be reset."""
        if not dropped:
            return
        first_dropped = self.first_seq - len(dropped)
        for subscriber in self._subscribers:
            behind = subscriber.position
            if not first_dropped <= behind < self.first_seq or subscriber.session_filter is None:
                continue  # not behind, or behind since an earlier drop (which it wanted)
            if not any(subscriber.wants(event) for event in dropped[behind - first_dropped :]):
                subscriber.skip_to(self.first_seq)

    def _past_bounds(self) -> bool:
        return len(self._ring) > self._retain_events or self._ring_bytes > self._retain_bytes


class FeedRetention:
    """The bound on the events all open objects' feeds keep for resuming, together: past it, the
    oldest event in the process is dropped, whichever object it belongs to. Without it each open
    object could keep its own `retain_bytes` (64 MiB × `--max-open-objects`).

    Used on the event loop's thread only, as the hubs are."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        # Every kept event in publish order, as (hub, revision). An event its hub dropped on its
        # own stays here until it reaches the front or the next sweep, which come only as events
        # are kept: the hub is held weakly, so those of a closed object's hub do not keep it
        # (each evicted object's hub stayed, about 3.4 KB, and an idle server kept them all).
        self._order: deque[tuple[weakref.ReferenceType[FeedHub], int]] = deque()
        self._count = 0  # events kept, in all hubs

    def kept(self, hub: FeedHub, revision: int, size: int) -> None:
        """`hub` keeps the event of `revision`: drops the oldest kept events while over the bound."""
        self._order.append((weakref.ref(hub), revision))
        self.bytes += size
        self._count += 1
        order = self._order
        spared: list[tuple[weakref.ReferenceType[FeedHub], int]] = []
        while self.bytes > self.max_bytes and order:
            entry = order.popleft()
            oldest_hub, oldest_revision = entry[0](), entry[1]
            if oldest_hub is None:
                continue  # its events went with it
            oldest_hub.drop_through(oldest_revision)
            if oldest_hub.keeps(oldest_revision):
                spared.append(entry)  # its latest commit, still to be read: dropped at a later turn
        order.extendleft(reversed(spared))
        if len(order) > 2 * self._count + 1024:  # mostly events dropped by their hubs: sweep them out
            self._order = deque(entry for entry in order if _still_kept(entry))

    def released(self, size: int) -> None:
        """A hub dropped one of its kept events."""
        self.bytes -= size
        self._count -= 1


def _still_kept(entry: tuple[weakref.ReferenceType[FeedHub], int]) -> bool:
    hub = entry[0]()
    return hub is not None and hub.keeps(entry[1])


class Feeds:
    """Makes each open object's feed hub, all sharing one settings and one process-wide bound."""

    def __init__(self, settings: FeedSettings | None = None) -> None:
        self.settings = settings or FeedSettings()
        self.retention = FeedRetention(self.settings.retain_total_bytes)

    def hub(self, after_epoch: int = 0) -> FeedHub:
        return FeedHub(self.settings, self.retention, after_epoch=after_epoch)
