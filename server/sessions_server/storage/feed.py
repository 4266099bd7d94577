"""The change feed of one object: revisions, retention, and subscribers (DESIGN.md §6).

Events are published by the object's writer only after their transaction committed, in commit
order, so revisions follow commit order across all writers. A revision is `epoch << 22 |
counter`, the epoch a millisecond clock. A feed takes its revisions from blocks of 4,096 that
the process hands out (`_allocate`), each above every block handed out before it and at or above
the clock's: an object's revisions increase across its feeds (an object closed and reopened) and
across restarts (unless the clock was set back across one: a resume from before then gets a
RESET, as any revision not of the current feed does), no two feeds of the process share one (a
revision of another object, or of the object's feed before a restart, is recognisably not this
feed's), and a feed knows its own (its start and its events', block by block: `FeedHub.knows`).

A bounded ring keeps recent events (by count and bytes), and one bound for the process
(`FeedRetention`) keeps the rings of all objects together within a budget, the oldest event
going first whichever object it belongs to. A subscriber is a place in the ring: it reads the
events after it in order, and publishing only wakes it, never waits for it. A subscriber
resuming from before what the ring keeps, or one so slow that the ring drops an event it has
not read, is told to reset (a subscriber to one session, only when such an event was of its
session); a slow reader never slows writers or other readers, and holds no events of its own.
What subscribers are still reading is spared past the bounds for a while: an object's latest
commit whole, and earlier commits within twice the ring's bounds; not for one that has taken
nothing for STALLED_SECONDS (its client stopped reading), which would otherwise keep them for
as long as it stays connected.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

from sessions_server.storage.rows import Compaction, RowInfo, held_bytes
from sessions_server.storage.watches import ChangeWatches

COUNTER_BITS = 22
COUNTER_LIMIT = 1 << COUNTER_BITS
# Revisions a feed takes at a time: 1,024 blocks a millisecond before the blocks run ahead of the
# clock (a hub is made in 2.5 us or more; a busy feed takes one block every 4,095 events).
BLOCK_BITS = 12
BLOCK = 1 << BLOCK_BITS
# Blocks a feed recognises its revisions in: its newest ~4 million events' (a resume from before
# them is told to reset, as one from before the ring is unless its session lost nothing).
BLOCKS_REMEMBERED = 1024
DEFAULT_RETAIN_EVENTS = 10_000
DEFAULT_RETAIN_BYTES = 64 * 1024 * 1024
DEFAULT_RETAIN_TOTAL_BYTES = 256 * 1024 * 1024
# Sessions whose newest dropped event a hub remembers for resuming subscribers to one session;
# past it, it remembers one revision for them all (as if every session had had that event).
# About 200 bytes each: at most ~50 KB a hub, ~13 MB with 256 objects open.
DROPPED_SESSIONS_REMEMBERED = 256
# Starts of feeds handed out before they carried an event (`QuietStarts`): at most ~5 MB with
# keys of 1 KiB.
QUIET_STARTS_REMEMBERED = 4096
# A subscriber with events to read that has taken none for this long holds none of them back
# from retention (they go as the bounds say, and it is reset when it reads again). Each one
# that stopped reading held its object's latest commit (up to the largest message, 4 bytes a
# character) past every bound for as long as it stayed connected: six such objects held 815 MiB
# against a process-wide bound of 256 MiB, and the bound dropped other objects' events instead,
# resetting their subscribers. A subscriber being sent an event is given a second more per
# MiB of it (a reader taking a 500 MB message at 1 MiB/s is not stalled).
STALLED_SECONDS = 30.0
GRACE_BYTES_PER_SECOND = 1024 * 1024


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
        self.active_at = time.monotonic()  # when it last looked for an event (or had none to read)
        self._sending = 0  # the size of the event it took last, being sent since

    def stalled(self, now: float) -> bool:
        """Whether it has looked for no event for STALLED_SECONDS, and a second more per MiB
        of the event it is being sent (with some to read: the hub marks those that have none as
        active when it publishes)."""
        return now - self.active_at > STALLED_SECONDS + self._sending / GRACE_BYTES_PER_SECOND

    def wants(self, event: ChangeEvent) -> bool:
        return self.session_filter is None or event.session_id == self.session_filter

    @property
    def resets_first(self) -> bool:
        """Whether the first thing it tells is a reset (placed after events no longer kept)."""
        return self._reset is not None

    @property
    def position(self) -> int:
        """The sequence number of the next event it will look at."""
        return self._next

    def skip_to(self, seq: int) -> None:
        """Places it at `seq`, having passed over what lay before (none of it for this subscriber)."""
        passed, self._next = self._next, seq
        self._hub.moved_on(passed)

    def wake(self) -> None:
        self._wakeup.set()

    def interrupt(self) -> None:
        """Makes `next` return None at once if it has nothing to deliver (its caller then looks
        at its own state, a revoked grant say, without waiting for the next event)."""
        self._interrupted = True
        self._wakeup.set()

    def _take(self) -> ChangeEvent | Reset | None:
        """The next thing to deliver, if any, moving the position past what it passes over."""
        self.active_at = time.monotonic()
        self._sending = 0
        if self._reset is not None:
            reset, self._reset = self._reset, None
            return reset
        hub = self._hub
        was = self._next
        if was < hub.first_seq:
            self._next = hub.next_seq
            hub.moved_on(was)
            hub.trim()  # it moved on: what it held back of the latest commit may go
            return Reset(hub.revision, "the subscriber fell behind: events it had not read were no longer retained")
        while self._next < hub.next_seq:
            event = hub.event_at(self._next)
            self._next += 1
            if self.wants(event):
                self._sending = event.size
                hub.moved_on(was)
                hub.trim()
                return event
        if self._next != was:
            hub.moved_on(was)
        hub.trim()
        return None

    async def next(self, timeout: float | None = None) -> ChangeEvent | Reset | None:
        """The next event, or None when `timeout` passed with nothing to deliver (then nothing
        up to the hub's current revision is for this subscriber). The timeout runs from the call,
        whatever wakes it meanwhile: a subscriber to one session is woken by every other
        session's event too, and waiting anew after each had it never time out on a busy object."""
        deadline: float | None = None
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
            wait = None
            if timeout is not None:
                now = asyncio.get_running_loop().time()
                if deadline is None:
                    deadline = now + timeout
                elif now >= deadline:
                    return None  # nothing for it up to the current revision (just looked)
                wait = deadline - now
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
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


_allocated = 0  # the first revision of the newest block handed out in this process
_allocation_lock = threading.Lock()  # the process's servers may run on loops of their own (tests)


def _allocate() -> int:
    """The first revision of a new block of `BLOCK`: above every block handed out before in this
    process, so no two feeds share a revision (two objects' feeds made within one millisecond
    once shared an epoch, and one's revision resumed on the other, skipping events silently); at
    or above the millisecond clock's first, so revisions increase across restarts (while the
    clock is not set back across one). The clock
    gives 1,024 blocks a millisecond; only past that do blocks run ahead of it (an epoch per hub
    from one counter ran a millisecond ahead for every hub made: 12 s after 20,000
    subscriptions in 8 s, and a restart then gave an object revisions below those it had)."""
    global _allocated
    clock = int(time.time() * 1000) << COUNTER_BITS
    with _allocation_lock:
        base = _allocated = max(clock, _allocated + BLOCK)
    return base


class FeedHub:
    """Revisions, the retention ring and the subscribers of one object."""

    def __init__(
        self,
        settings: FeedSettings | None = None,
        retention: FeedRetention | None = None,
        *,
        starts: QuietStarts | None = None,
        object_key: str = "",
    ) -> None:
        """`starts`: where the process remembers starts of feeds that carried no event, with their
        object (`object_key`); once this hub carried an event, or was closed by a move, it forgets
        there every start of its object's feeds. Its revisions start above every feed's
        made before it in the process."""
        settings = settings or FeedSettings()
        self._retention = retention
        self._starts = starts
        self._object_key = object_key
        self._ref = weakref.ref(self)  # what the process-wide bound holds of it
        self._start = self._base = _allocate()
        self._counter = 0  # revisions taken of the block at `_base`
        # The blocks it took, oldest first (the newest BLOCKS_REMEMBERED or more): those of the
        # revisions it handed out, for `knows`.
        self._bases = [self._base]
        self._ring: deque[ChangeEvent] = deque()
        self._ring_sizes: deque[int] = deque()  # each ring event's `size`, computed once
        self._ring_bytes = 0
        # Every event published gets the next sequence number (unlike revisions, they run on
        # through blocks): the ring holds those from `first_seq` to `next_seq - 1`.
        self.first_seq = 0
        self.next_seq = 0
        self._latest_from = 0  # the first sequence number of the latest commit
        self._retain_events = settings.retain_events
        self._retain_bytes = settings.retain_bytes
        self._subscribers: set[Subscription] = set()
        # Whether its events are kept for resumes: only from its first subscriber on. Its
        # revisions reach callers through subscriptions alone, so before the first one nobody
        # can resume from any of them, and an object nobody subscribes to kept up to
        # --feed-retain-bytes of event text (deleted and cleared messages' included) for nothing.
        self._keeping = False
        self._closed: FeedClosed | None = None
        # The revision of each session's newest dropped event, and one for every session
        # forgotten when there were too many: what a resume to one session may have missed.
        self._dropped: dict[str, int] = {}
        self._dropped_floor = 0
        self._last_dropped = 0  # the revision of the newest dropped event
        # The ring's events before sequence number `_owed_to` (none when 0): those the
        # process-wide bound would have dropped but this hub spared (see `owe`), and whether
        # some of them may go now, the bound told so (`_payable`).
        self._owed_to = 0
        self._payable = False
        # A look, STALLED_SECONDS on, at what it spares past the bounds: what a subscriber that
        # stopped reading held back goes then, even if nothing is published meanwhile.
        self._recheck: asyncio.TimerHandle | None = None
        # `_read_by_all` as last found, with how many subscribers were there, until they have all
        # moved on (or one came, left or stalled): every read asks for it while the ring is past
        # its bounds, and finding it looks at every subscriber (200 reading a batch of 12,000
        # took about a minute of the event loop).
        self._unread_from = 0
        self._at_unread = 0
        self._unread_known = False
        self.watches = ChangeWatches()  # compactions' watches over the object's sessions (`watches`)

    @property
    def revision(self) -> int:
        """The revision of the newest event (the feed's start before any)."""
        return self._base + self._counter

    @property
    def start_revision(self) -> int:
        """The revision a subscriber is told before the feed carried any event."""
        return self._start

    @property
    def carried_events(self) -> bool:
        """Whether it published an event (its revision is no longer its start)."""
        return self._base + self._counter != self._start

    @property
    def epoch(self) -> int:
        return self._base >> COUNTER_BITS

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, events: list[ChangeEvent]) -> None:
        """Assigns revisions, retains, and delivers; call only after the events' commit.

        The events of the latest commit stay until every subscriber has read past them, even
        past the retention bounds: a commit larger than those (a batch of 12,000 messages, one
        70 MiB message, a group commit of many batches) would otherwise be dropped before any
        subscriber could read it, resetting them all. Older events go as the bounds say."""
        ring, sizes, retention = self._ring, self._ring_sizes, self._retention
        now = time.monotonic()
        for subscriber in self._subscribers:
            if subscriber.position >= self.next_seq:  # had nothing to read: not stalled on these
                subscriber.active_at = now
        self._unread_known = False
        self._latest_from = self.next_seq
        if self._owed_to:  # the previous commit may go now
            self._settle_owed()
        if self._closed is not None and self._starts is not None:  # events nobody will be told of
            self._starts.forget_object(self._object_key)
        for event in events:
            counter = self._counter + 1
            if counter >= BLOCK:
                self._next_block()
                counter = 1
            self._counter = counter
            event.revision = self._base + counter
            if self._closed is not None:  # no subscriber now or later: nothing to keep
                continue
            if not self._keeping:  # nobody was told a revision yet; a resume from one is reset
                self._last_dropped = self._dropped_floor = event.revision
                continue
            size = event.size
            ring.append(event)
            sizes.append(size)
            self.next_seq += 1
            self._ring_bytes += size
            if len(ring) > self._retain_events or self._ring_bytes > self._retain_bytes:
                self._trim_to_bounds()
            if retention is not None:
                retention.kept(self, self.next_seq - 1, size)
        for subscriber in self._subscribers:
            subscriber.wake()

    def _next_block(self) -> None:
        self._base = _allocate()
        self._counter = 0
        bases = self._bases
        bases.append(self._base)
        if len(bases) > 2 * BLOCKS_REMEMBERED:
            del bases[:BLOCKS_REMEMBERED]

    def knows(self, revision: int) -> bool:
        """Whether it handed out `revision`: its start, or one of its events' (of the blocks it
        remembers). One of another object's feed, of the object's feed before this one (closed
        and reopened, or before a restart), or of none, it does not."""
        if revision == self._start:
            return True
        if not self._start < revision <= self._base + self._counter:
            return False
        bases = self._bases
        index = bisect.bisect_right(bases, revision) - 1
        # A block's first revision is none of its events' (the first takes the next one).
        return index >= 0 and 0 < revision - bases[index] < BLOCK

    def subscribe(self, session_filter: str | None, resume_after: int) -> Subscription:
        """A new subscriber, placed after the retained event of `resume_after` (0: live only),
        or told first to reset when the events after it are no longer (or never were) kept."""
        if self._closed is not None:
            raise FeedClosed(str(self._closed), moving=self._closed.moving)
        subscription = Subscription(self, session_filter, self.next_seq)
        self._keeping = True
        self._unread_known = False  # it may be behind every other one
        if resume_after:
            current = self.revision
            if resume_after > current:
                subscription._reset = Reset(
                    current,
                    "unknown revision, ahead of this object's feed (another server's, or the feed restarted: "
                    "the object was reopened or the server restarted)",
                )
            elif not self.knows(resume_after):
                subscription._reset = Reset(current, self._unknown(resume_after))
            elif resume_after >= self._last_dropped:  # every event after it is kept
                revisions = [event.revision for event in self._ring]
                subscription._next = self.first_seq + bisect.bisect_right(revisions, resume_after)
            elif self._kept_all_after(session_filter, resume_after):
                subscription._next = self.first_seq  # all the ring's events are after it
            else:
                subscription._reset = Reset(current, "events were not retained")
        self._subscribers.add(subscription)
        return subscription

    def _unknown(self, revision: int) -> str:
        """Why a resume from `revision`, not one this feed knows (and not ahead of it), is reset."""
        if revision < self._start:
            return (
                "the feed restarted (the object was closed and reopened, erased, replaced or moved, or the "
                "server restarted), or the revision is not this object's"
            )
        if revision < self._bases[0]:
            return "events were not retained"  # a block it no longer remembers
        return "unknown revision: not one of this object's feed"

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
        self._unread_known = False
        if self._owed_to:  # it may have been the one holding them back
            self._settle_owed()

    def close_all(self, why: FeedClosed) -> None:
        """Ends every subscription with `why`, and refuses later ones with it."""
        if self._starts is not None and (why.moving or self.carried_events):
            # A resume from any start of the object's feeds before this one would miss them.
            self._starts.forget_object(self._object_key)
        self._closed = why
        while self._ring:
            self._drop_oldest()
        self._owed_to = 0
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        for subscription in list(self._subscribers):
            subscription.close(why)

    def _drop_oldest(self) -> ChangeEvent:
        event = self._ring.popleft()
        self.first_seq += 1
        self._last_dropped = event.revision
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

    # ── the process-wide bound's side (`FeedRetention`), by sequence number ──────────

    def keeps(self, seq: int) -> bool:
        """Whether the ring still holds the event of sequence number `seq` (one it published)."""
        return self.first_seq <= seq

    def drop_through(self, seq: int) -> None:
        """Drops the retained events up to sequence number `seq` (the process-wide bound's
        decision), but none of the latest commit a subscriber has still to read."""
        if self.first_seq > seq:
            return
        dropped: list[ChangeEvent] = []
        limit = self._latest_from  # earlier commits' events may go whoever reads
        while self.first_seq <= seq:
            if self.first_seq >= limit:
                limit = self._droppable_before()  # of the latest commit: what all have read
                if self.first_seq >= limit:
                    break
            dropped.append(self._drop_oldest())
        self._carry_past(dropped)

    def owe(self, seq: int) -> None:
        """The process-wide bound would drop the events up to sequence number `seq` (all it
        looked at of this hub's), but they are of the latest commit and a subscriber has still
        to read them: the hub keeps them and owes them to the bound, which forgets them (it
        walked them again at every later event kept: publishing a commit of N events took
        O(N²)). They go as soon as they may while the bound is over its budget (`_settle_owed`,
        as the subscribers read and at the next commit); those that may go once it is within
        it again, it takes first when it next needs room (`_pay`): they are the oldest."""
        if seq >= self._owed_to:
            self._owed_to = seq + 1
        self._recheck_later()

    def _settle_owed(self) -> None:
        """Pays what it owes the process-wide bound of what may go now (see `owe`)."""
        if self.first_seq >= self._owed_to:  # all gone meanwhile
            self._owed_to = 0
            return
        limit = min(self._droppable_before(), self._owed_to)
        if self.first_seq >= limit:
            return  # all still to be read
        retention = self._retention
        assert retention is not None  # only the bound makes debts
        if retention.bytes > retention.max_bytes:
            self._drop_owed(limit, retention)
        if self.first_seq >= self._owed_to:
            self._owed_to = 0
        elif self.first_seq < limit and not self._payable:  # the bound takes them when it needs room
            self._payable = True
            retention.payable(self._ref)

    def _pay(self) -> bool:
        """Drops what it owes the process-wide bound (over its budget) of what may go, oldest
        first, while the bound is over its budget; whether some may still go."""
        if self.first_seq >= self._owed_to:
            self._owed_to = 0
        else:
            limit = min(self._droppable_before(), self._owed_to)
            assert self._retention is not None
            self._drop_owed(limit, self._retention)
            if self.first_seq >= self._owed_to:
                self._owed_to = 0
            elif self.first_seq < limit:
                return True  # the bound has room again before these
        self._payable = False
        return False

    def _drop_owed(self, limit: int, retention: FeedRetention) -> None:
        dropped: list[ChangeEvent] = []
        while self.first_seq < limit and retention.bytes > retention.max_bytes:
            dropped.append(self._drop_oldest())
        self._carry_past(dropped)

    def _droppable_before(self) -> int:
        """Events before this sequence number may be dropped: those of earlier commits, and
        those of the latest commit that every subscriber still reading has read past."""
        return max(self._latest_from, self._read_by_all())

    def _read_by_all(self) -> int:
        """The sequence number of the first event a subscriber still reading (not stalled) has
        not read; `next_seq` when there is none."""
        if not self._unread_known:
            now = time.monotonic()
            positions = [subscriber.position for subscriber in self._subscribers if not subscriber.stalled(now)]
            self._unread_from = min(positions, default=self.next_seq)
            self._at_unread = positions.count(self._unread_from)
            self._unread_known = True
        return self._unread_from

    def moved_on(self, position: int) -> None:
        """A subscriber moved on from `position`."""
        if self._unread_known and position == self._unread_from:
            self._at_unread -= 1
            if self._at_unread <= 0:
                self._unread_known = False

    def trim(self) -> None:
        """Drops the oldest events while the ring is past its bounds, sparing what subscribers
        have still to read of the latest commit (which may take it past them), and pays what it
        owes the process-wide bound. Runs as events arrive and as subscribers read."""
        if self._owed_to:
            self._settle_owed()
        if len(self._ring) > self._retain_events or self._ring_bytes > self._retain_bytes:
            self._trim_to_bounds()

    def _trim_to_bounds(self) -> None:
        """Drops the oldest events while past the bounds, but none of the latest commit that a
        subscriber still reading has not read, nor of earlier commits within twice the bounds
        (a batch of 12,000 messages followed by any write was cut to 10,000 under subscribers
        reading it as fast as they could, resetting them all)."""
        unread = self._read_by_all()
        limit = max(self._latest_from, unread)
        dropped: list[ChangeEvent] = []
        while self._ring and self._past_bounds() and self.first_seq < limit:
            if self.first_seq >= unread and not self._past_bounds(twice=True):
                break
            dropped.append(self._drop_oldest())
        self._carry_past(dropped)
        if self._past_bounds():
            self._recheck_later()

    def _recheck_later(self) -> None:
        """Looks again at what it spares once a subscriber that stopped reading now would count
        as stalled (no loop running: a test driving the hub by hand, which trims as it likes)."""
        if self._recheck is not None or self._closed is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._recheck = loop.call_later(STALLED_SECONDS + 1.0, self._look_again)

    def _look_again(self) -> None:
        self._recheck = None
        self._unread_known = False  # some may have stalled since
        self.trim()
        if self._owed_to or self._past_bounds():
            self._recheck_later()

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

    def _past_bounds(self, *, twice: bool = False) -> bool:
        factor = 2 if twice else 1
        return len(self._ring) > factor * self._retain_events or self._ring_bytes > factor * self._retain_bytes


class FeedRetention:
    """The bound on the events all open objects' feeds keep for resuming, together: past it, the
    oldest event in the process is dropped, whichever object it belongs to. Without it each open
    object could keep its own `retain_bytes` (64 MiB × `--max-open-objects`). An event of an
    object's latest commit that a subscriber has still to read is spared: its hub owes it, and
    pays as soon as it may (`FeedHub.owe`); the bound looks at each event once per time it is
    spared, so keeping an event costs O(1) amortized, however large the commit.

    Used on the event loop's thread only, as the hubs are."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        # Hubs owing it events that may go now (`FeedHub._pay`), the first to owe first: older
        # than any event in `_order` (it was at the front of it when spared).
        self._payable: deque[weakref.ReferenceType[FeedHub]] = deque()
        # Kept events in publish order, as (hub, sequence number), but for those a hub owes. An
        # event its hub dropped on its own stays here until it reaches the front or the next
        # sweep, which come only as events are kept: the hub is held weakly, so those of a
        # closed object's hub do not keep it (each evicted object's hub stayed, about 3.4 KB,
        # and an idle server kept them all).
        self._order: deque[tuple[weakref.ReferenceType[FeedHub], int]] = deque()
        self._count = 0  # events kept, in all hubs

    def kept(self, hub: FeedHub, seq: int, size: int) -> None:
        """`hub` keeps its event of sequence number `seq`: drops the oldest kept events while
        over the bound."""
        order = self._order
        order.append((hub._ref, seq))
        self.bytes += size
        self._count += 1
        if self.bytes > self.max_bytes:
            self._make_room()
        if len(order) > 2 * self._count + 1024:  # mostly events dropped by their hubs: sweep them out
            self._order = deque(entry for entry in order if _still_kept(entry))

    def _make_room(self) -> None:
        order, payable = self._order, self._payable
        while self.bytes > self.max_bytes:
            if payable:  # spared events that may go now: the oldest
                debtor = payable[0]()
                if debtor is None or not debtor._pay():
                    payable.popleft()
                continue
            if not order:
                return
            ref, oldest = order.popleft()
            oldest_hub = ref()
            if oldest_hub is None:
                continue  # its events went with it
            if oldest_hub._owed_to and oldest >= oldest_hub._owed_to:
                oldest_hub._owed_to = oldest + 1  # after what it owes, all still to be read: spared too
                continue
            oldest_hub.drop_through(oldest)
            if oldest_hub.keeps(oldest):
                oldest_hub.owe(oldest)  # its latest commit, still to be read: it pays later

    def payable(self, hub: weakref.ReferenceType[FeedHub]) -> None:
        """`hub` owes events that may go now: taken first when the bound next needs room."""
        self._payable.append(hub)

    def released(self, size: int) -> None:
        """A hub dropped one of its kept events."""
        self.bytes -= size
        self._count -= 1


def _still_kept(entry: tuple[weakref.ReferenceType[FeedHub], int]) -> bool:
    hub = entry[0]()
    return hub is not None and hub.keeps(entry[1])


class QuietStarts:
    """Feed starts handed out before their feed carried any event (a subscription's opening
    revision), the newest QUIET_STARTS_REMEMBERED, each with its object's key: a resume from one,
    once that feed is gone, starts where the object's current feed started
    (`SessionsService.subscribe`), as a subscriber that had stayed would have been told nothing
    since: every change to an object's messages is an event of its feed. A feed that carried an
    event, or was closed by a move, forgets every start of its object's (`FeedHub.close_all`),
    and so does the object's file being replaced or removed (`ObjectRegistry.close_object`): a
    resume from one is told to reset, as from any revision of a feed gone (a subscriber to an
    object erased after a restart was never told, and one resuming from the start of a feed
    before the one that carried a clear missed the clear)."""

    def __init__(self, limit: int = QUIET_STARTS_REMEMBERED) -> None:
        self._limit = limit
        self._keys: dict[int, str] = {}  # revision -> object key, oldest first
        self._by_object: dict[str, set[int]] = {}

    def note(self, revision: int, object_key: str) -> None:
        keys = self._keys
        if revision in keys:
            return
        keys[revision] = object_key
        self._by_object.setdefault(object_key, set()).add(revision)
        if len(keys) > self._limit:
            self._forget(next(iter(keys)))

    def key_of(self, revision: int) -> str | None:
        """The object a start of a feed that carried no event was handed out for, if remembered."""
        return self._keys.get(revision)

    def _forget(self, revision: int) -> None:
        object_key = self._keys.pop(revision, None)
        if object_key is not None:
            revisions = self._by_object[object_key]
            revisions.discard(revision)
            if not revisions:
                del self._by_object[object_key]

    def forget_object(self, object_key: str) -> None:
        for revision in self._by_object.pop(object_key, ()):
            del self._keys[revision]


class Feeds:
    """Makes each open object's feed hub, all sharing one settings, one process-wide bound and
    one record of the starts of feeds that carried no event."""

    def __init__(self, settings: FeedSettings | None = None) -> None:
        self.settings = settings or FeedSettings()
        self.retention = FeedRetention(self.settings.retain_total_bytes)
        self.quiet_starts = QuietStarts()

    def hub(self, object_key: str) -> FeedHub:
        return FeedHub(self.settings, self.retention, starts=self.quiet_starts, object_key=object_key)
