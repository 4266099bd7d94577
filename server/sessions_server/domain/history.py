"""Reading a session's paths: root-to-leaf reads, newest-first walks, budgeted recent windows,
row statistics, the active leaf and branches, with compaction overlays collapsed.

Reads hydrate in bounded windows and yield each as it is read, so no read holds a whole
transcript; a path the memo remembers (`paths`) is served from memory.

Each window is one state of the session, and a read's first window is read in the snapshot its
plan (the path, its overlays) was made in: a read of a short session is one state. What the
memo holds is taken into a snapshot only while it agrees with it (`ObjectStore.memo_epoch`: no
commit was waiting for its bookkeeping when the snapshot began, nor came while the memo was
consulted). A committed write is visible to other readers before the memo notes it on the event
loop, and a path or message taken from the memo beside rows read from storage made states that
never existed: a cleared message's old text under a new path, an older path with a newer text.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from bisect import bisect_right
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from typing import TypeVar

from sessions_server.domain import large_messages, paths
from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.overlays import (
    OverlaySpan,
    SpanRecord,
    overlay_id,
    overlay_message_json,
    plan_overlays,
)
from sessions_server.domain.paths import ROW_ID, STORED_BYTES
from sessions_server.domain.views import MessageView, view_of, views_by_id
from sessions_server.storage import queries
from sessions_server.storage.queries import CompactionSpan, Connection
from sessions_server.storage.rows import COMPACTION_PREFIX, MAX_PATH_DEPTH, PathStat, RowInfo
from sessions_server.storage.store import ObjectStore

# Upstream's hydration windows: forward reads fetch at most 50 rows and 4 MiB of stored bytes per
# query (an oversized row alone); newest-first prefix streams use 8-row windows.
WINDOW_ROWS = 50
WINDOW_BYTES = 4 * 1024 * 1024
# Past the first window of a read, windows double up to this many rows (forward reads keep the
# byte bound, and newest-first reads take it on): the first message comes as soon as upstream's
# would, and a long read pays one executor hop per few hundred rows instead of per 50 (or 8).
WINDOW_MAX_ROWS = 400
# A path window of at most this many stored bytes is read as a quick read (in place for a lone
# caller, stopped after 5 ms to run again on the executor): a short session's whole history, and
# every window of a long one of small messages. Windows keep a timing estimate of their own, apart
# from point reads and walks. Their reads cost by the row more than by the byte (400 rows of 1 KB
# in place: 1.7 ms p50, 2.6 ms p90); the bound is for media put back inline, Python work that
# the stop cannot interrupt.
QUICK_WINDOW_BYTES = 1024 * 1024
NEWEST_FIRST_WINDOW_ROWS = 8
# Newest-first walks read this many rows per executor hop at first, doubling up to the maximum,
# so a reader that stops after one message costs a handful of row lookups.
WALK_FIRST_STEPS = 4
WALK_MAX_STEPS = 64
DEFAULT_BATCH_SIZE = 50
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
_SPAN_START = operator.attrgetter("start")
# The kind of quick read that reads an overlay's summary (`ObjectStore.read`).
SUMMARY_READ = "summary"


@dataclass(frozen=True, slots=True)
class RecentSummary:
    truncated: bool
    total_content_bytes: int


# A budgeted read's plan: the rows to read, whether older ones were left out, the path's stored
# bytes in all, and the session's compactions (without their summaries, read as overlays are sent).
_RecentPlan = tuple[list[PathStat], bool, int, list[CompactionSpan]]

# One step of a walk from the leaf: the views read, rows walked, where to go on, and whether the
# walk reached a row that ends a compaction (from which overlays must be planned).
_WalkStep = tuple[list[MessageView], int, str | None, bool]
# A remembered path (or its newest rows, when no record can apply) and the overlays planned on it.
_Remembered = tuple[list[PathStat], list[OverlaySpan]]
T = TypeVar("T")


def latest_leaf(conn: Connection, store: ObjectStore, session_id: str, inline: bool) -> MessageView | None:
    """The active leaf, skipping hidden overlay rows towards the root."""
    leaf = store.latest_leaf_id(conn, session_id)
    if leaf is None:
        return None
    hidden = _hidden_row_ids(conn, session_id)
    passed: set[str] = set()
    while leaf is not None and leaf in hidden:
        if leaf in passed or len(passed) > MAX_PATH_DEPTH:
            return None  # imported rows can be their own ancestors: no visible row above them
        passed.add(leaf)
        _, leaf = queries.parent_of(conn, session_id, leaf)
    return None if not leaf else view_of(conn, queries.get_message(conn, session_id, leaf), inline)


async def messages_in_windows(
    store: ObjectStore, session_id: str, ids: Sequence[str], inline: bool, *, start: int = 0, rows: int = WINDOW_ROWS
) -> AsyncGenerator[list[MessageView], None]:
    """The messages of `ids` (distinct) that exist, in that order, a window a read: at most
    WINDOW_ROWS rows and WINDOW_BYTES of stored bytes (a larger message alone), sized before they
    are read, so that no read holds more than a window of them however large they are; a window
    whose payloads read back larger ends after the message that passes WINDOW_BYTES. Past the
    first, windows double up to WINDOW_MAX_ROWS rows, as a history read's do. `start` and `rows`:
    where to begin, and the first window's rows, when a first window was read already."""
    while start < len(ids):
        candidates = ids[start : start + rows]
        read = functools.partial(_id_window, session_id=session_id, candidates=candidates, inline=inline)
        taken, found = await store.read(read, quick=not large_messages.any_known_large(store, session_id, candidates))
        yield _found_in_order(store, session_id, candidates[:taken], found)
        start += taken
        rows = min(rows * 2, WINDOW_MAX_ROWS)


async def branches(
    store: ObjectStore, session_id: str, message_id: str, inline: bool
) -> AsyncGenerator[list[MessageView], None]:
    """A message's direct children (`branch_ids`), their first window read in the snapshot the
    children were found in (a child re-parented meanwhile came back naming its new parent)."""

    def first(conn: Connection) -> tuple[list[str], int, dict[str, MessageView]]:
        ids = branch_ids(conn, session_id, message_id)
        return ids, *_id_window(conn, session_id, ids[:WINDOW_ROWS], inline)

    ids, taken, found = await store.read(first, quick=True)
    if not ids:
        return
    yield _found_in_order(store, session_id, ids[:taken], found)
    async for window in messages_in_windows(
        store, session_id, ids, inline, start=taken, rows=min(2 * WINDOW_ROWS, WINDOW_MAX_ROWS)
    ):
        yield window


def _id_window(
    conn: Connection, session_id: str, candidates: Sequence[str], inline: bool
) -> tuple[int, dict[str, MessageView]]:
    """The first of `candidates` that fit a window by their stored bytes, read: how many of
    them the views answer, and the views by id."""
    with_attachments = inline and queries.has_attachment_refs(conn, session_id)
    sizes = queries.stored_bytes(conn, session_id, candidates, with_attachments=with_attachments)
    taken, total = 0, 0
    for message_id in candidates:
        total += sizes.get(message_id, 0)
        if taken and total > WINDOW_BYTES:
            break
        taken += 1
    found, answered = views_by_id(conn, session_id, candidates[:taken], inline, WINDOW_BYTES)
    return answered, found


def _found_in_order(
    store: ObjectStore, session_id: str, ids: Sequence[str], found: dict[str, MessageView]
) -> list[MessageView]:
    for message_id, view in found.items():
        large_messages.note_read(store, session_id, message_id, len(view.json))
    return [found[message_id] for message_id in ids if message_id in found]


def branch_ids(conn: Connection, session_id: str, message_id: str) -> list[str]:
    """Direct children in seq order; hidden overlay children are replaced by their own (upstream's
    rule). Ids only: the messages are read a bounded window at a time (`messages_in_windows`)."""
    hidden = _hidden_row_ids(conn, session_id)
    rows = queries.children(conn, session_id, message_id)
    if hidden:
        # Level by level, each hidden row expanded once: imported rows can form parent cycles,
        # and a chain of hidden rows can be deeper than Python's stack.
        shown: list[tuple[str, int]] = []
        expanded = {message_id}
        level, depth = rows, 0
        while level and depth <= MAX_PATH_DEPTH:
            below: list[tuple[str, int]] = []
            for child_id, seq in level:
                if child_id not in hidden:
                    shown.append((child_id, seq))
                elif child_id not in expanded:
                    expanded.add(child_id)
                    below.extend(queries.children(conn, session_id, child_id))
            level, depth = below, depth + 1
        rows = sorted(shown, key=operator.itemgetter(1))
    return [child_id for child_id, _ in rows]


def row_stats(conn: Connection, store: ObjectStore, session_id: str, leaf_id: str) -> list[PathStat]:
    """Per-row stored bytes and token estimates along a path (at most 10,001 rows)."""
    stamp = paths.walk_stamp(store, session_id)  # before the snapshot
    leaf = resolve_leaf(store, conn, session_id, leaf_id)
    return [] if not leaf else paths.path_stats(store, conn, session_id, leaf, stamp).rows


async def from_root(
    store: ObjectStore, session_id: str, leaf_id: str, inline: bool
) -> AsyncGenerator[list[MessageView], None]:
    """One root-to-leaf path with overlays applied, root first, in windows."""

    def attempt(conn: Connection, stamp: paths.WalkStamp, epoch: int | None) -> _Started:
        leaf = resolve_leaf(store, conn, session_id, leaf_id)
        if not leaf:  # an empty id as the leaf reads as no leaf, as upstream
            return _Started()
        records = queries.compaction_spans(conn, session_id)
        trusted = epoch is not None
        remembered = paths.remembered_overlaid_path(store, session_id, leaf, records) if records and trusted else None
        if remembered is not None:
            stats, spans = remembered
        else:
            stats, spans = paths.path_stats(store, conn, session_id, leaf, stamp, remembered=trusted).rows, None
        return _start_path(conn, store, session_id, stats, records, spans, inline=inline, epoch=epoch, stamp=stamp)

    # In place for a lone caller: a remembered path (an agent's read after its append) costs
    # point reads; a walk that outlasts a quick read (a long session's) runs again on the executor.
    started = await store.read(functools.partial(_planned, store, session_id, attempt), quick=True)
    async for window in _stream(store, session_id, started, inline=inline):
        yield window


async def recent(
    store: ObjectStore, session_id: str, max_content_bytes: int, leaf_id: str, inline: bool
) -> AsyncGenerator[RecentSummary | list[MessageView], None]:
    """The longest recent suffix whose stored bytes fit the budget, never less than the leaf.
    Yields the summary first, then the messages in windows."""

    def planned(conn: Connection, suffix: paths.PathSuffix) -> _RecentPlan:
        if not suffix.rows:
            return [], False, 0, []
        # The depth cap hides older rows as the budget does; a path of exactly the cap's
        # length is complete, so only a walk whose oldest row still has a parent counts.
        capped = (
            suffix.walked > MAX_PATH_DEPTH
            and suffix.oldest_id is not None
            and queries.parent_of(conn, session_id, suffix.oldest_id)[1] is not None
        )
        return suffix.rows, suffix.cut or capped, suffix.stored_bytes, queries.compaction_spans(conn, session_id)

    def attempt(conn: Connection, stamp: paths.WalkStamp, epoch: int | None) -> tuple[RecentSummary, _Started]:
        leaf = resolve_leaf(store, conn, session_id, leaf_id)
        if not leaf:  # an empty id as the leaf reads as no leaf, as upstream
            return RecentSummary(False, 0), _Started()
        # The remembered path gives the suffix without a pass over the path; else the walk,
        # which is then remembered.
        trusted = epoch is not None
        suffix = paths.remembered_suffix(store, session_id, leaf, max_content_bytes) if trusted else None
        if suffix is None:
            walked = paths.path_stats(store, conn, session_id, leaf, stamp, remembered=trusted)
            suffix = paths.suffix_of(walked, max_content_bytes)
        window, truncated, total, records = planned(conn, suffix)
        started = _start_path(conn, store, session_id, window, records, None, inline=inline, epoch=epoch, stamp=stamp)
        return RecentSummary(truncated, total), started

    # In place for a lone caller, as a root-first read's plan: a walk that outlasts a quick
    # read (a long session's) runs again on the executor.
    summary, started = await store.read(functools.partial(_planned, store, session_id, attempt), quick=True)
    yield summary
    async for views in _stream(store, session_id, started, inline=inline):
        yield views


async def from_leaf(
    store: ObjectStore, session_id: str, leaf_id: str, inline: bool, limit: int = 0
) -> AsyncGenerator[list[MessageView], None]:
    """Leaf to root along the parent pointers, a few rows per read (one statement); switches
    to planned overlays at the first visible row that ends some compaction (everything after it
    is exact without planning).
    A path the memo holds is streamed from it instead. The first read also takes the walk's
    first steps, so the newest messages come back after one read. With a `limit`, no read
    takes more rows than the messages still wanted. Every read looks up at most
    WALK_MAX_STEPS rows by key, and WINDOW_BYTES of stored bytes (a larger message alone),
    ending after a message whose payloads bring what it read back past WINDOW_BYTES; marked
    quick: a lone caller's walk reads without thread hops."""
    span_ends: set[str] = set()
    hidden: set[str] = set()
    wanted = limit or MAX_PATH_DEPTH + 1

    def walk(conn: Connection, first: str, budget: int, depth: int) -> _WalkStep:
        wanted_rows = min(budget, MAX_PATH_DEPTH + 1 - depth)
        with_attachments = inline and queries.has_attachment_refs(conn, session_id)
        taken = queries.ancestors(conn, session_id, first, wanted_rows, WINDOW_BYTES, with_attachments=with_attachments)
        views: list[MessageView] = []
        held, walked = 0, 0
        for row in taken:
            # A hidden row ends no span the plan draws (its id is not on the path), so the walk
            # goes through it as the root-first read does; upstream's stops there, with nothing
            # older (a deliberate difference: newest-first stays the reverse of root-first).
            if row.info.id in span_ends and row.info.id not in hidden:
                return views, walked, row.info.id, True
            walked += 1
            if row.info.id not in hidden:
                view = view_of(conn, row, inline)
                if view is not None:
                    views.append(view)
                    held += len(view.json)
                    if held > WINDOW_BYTES:  # payloads named many times read back larger than stored
                        break
        # The path goes on from the last row's parent unless the chain reached a root: also
        # when the bytes cut this step short, or the parent is missing (the next step then
        # reads nothing, and the path ends there).
        current = taken[walked - 1].info.parent_id if walked else None
        depth += walked
        return views, walked, (current if depth <= MAX_PATH_DEPTH else None), False

    def attempt(conn: Connection, stamp: paths.WalkStamp, epoch: int | None) -> _LeafStart:
        leaf = resolve_leaf(store, conn, session_id, leaf_id)
        records = queries.compaction_spans(conn, session_id)
        remembered: _Remembered | None = None
        if leaf and records and epoch is not None:
            # Overlays are planned over the whole path, once while it is remembered.
            remembered = paths.remembered_overlaid_path(store, session_id, leaf, records)
        elif leaf and epoch is not None:  # without any, the newest rows suffice
            rows = paths.remembered_path(store, session_id, leaf, wanted)
            remembered = None if rows is None else (rows, [])
        # Before the return below too: a walk from a leaf whose id is "" switches to overlays.
        span_ends.update(record.to_message_id for record in records)
        hidden.update(hidden_ids(records))
        if not leaf or remembered is None:
            return leaf, records, None, None if not leaf else walk(conn, leaf, min(WALK_FIRST_STEPS, wanted), 0)
        rows, spans = remembered
        started = _start_path(
            conn, store, session_id, rows, records, spans, newest_first=True, inline=inline, epoch=epoch, stamp=stamp
        )
        return leaf, records, (rows, started), None

    leaf, records, path, step = await store.read(functools.partial(_planned, store, session_id, attempt), quick=True)
    next_id = leaf
    depth = 0
    if path is not None:  # no walk: the path's messages are likely remembered too
        remembered, started = path
        asked = wanted
        async for window in _stream(store, session_id, started, inline=inline):
            wanted -= len(window)
            yield window
        if records or wanted <= 0 or len(remembered) < asked:
            return
        # Only the newest rows were taken and some did not read as messages: walk on from
        # the oldest of them.
        oldest = remembered[0].id
        next_id = await store.read(lambda conn: queries.parent_of(conn, session_id, oldest)[1], quick=True)
        depth = len(remembered)
    steps = WALK_FIRST_STEPS
    while next_id is not None and depth <= MAX_PATH_DEPTH and wanted > 0:
        taken: _WalkStep
        if step is not None:
            taken, step = step, None
        else:
            read_step = functools.partial(walk, first=next_id, budget=min(steps, wanted), depth=depth)
            taken = await store.read(read_step, quick=True)
        views, walked, next_id, switch = taken
        depth += walked
        # Doubling spares a reader that stops early from reading ahead; a reader that named
        # its count wants every row of it, and each response costs a write round trip.
        steps = WALK_MAX_STEPS if limit else min(steps * 2, WALK_MAX_STEPS)
        if views:
            wanted -= len(views)
            yield views
        if switch and next_id is not None:
            # From the leaf resolved at the start: the active leaf may since have moved to a
            # branch without this row, and the read would end here, short.
            async for window in _overlaid_prefix(store, session_id, leaf, next_id, records, inline):
                yield window
            return


async def _overlaid_prefix(
    store: ObjectStore,
    session_id: str,
    leaf: str | None,
    from_id: str,
    records: list[CompactionSpan],
    inline: bool,
) -> AsyncGenerator[list[MessageView], None]:
    def attempt(conn: Connection, stamp: paths.WalkStamp, epoch: int | None) -> _Started:
        # With each row's stored bytes, so that windows keep to WINDOW_BYTES. "": as upstream.
        trusted = epoch is not None
        rows = [] if not leaf else paths.path_stats(store, conn, session_id, leaf, stamp, remembered=trusted).rows
        path = [row.id for row in rows]
        if from_id not in path:
            return _Started()
        end = path.index(from_id)
        spans = [span for span in plan_overlays(path, records) if span.end <= end]
        stats = rows[: end + 1]
        return _start_path(
            conn, store, session_id, stats, records, spans, newest_first=True, inline=inline, epoch=epoch, stamp=stamp
        )

    # A walk that outlasts a quick read runs again on the executor.
    started = await store.read(functools.partial(_planned, store, session_id, attempt), quick=True)
    async for window in _stream(store, session_id, started, inline=inline):
        yield window


async def first_messages(
    windows: AsyncGenerator[list[MessageView], None], limit: int
) -> AsyncGenerator[list[MessageView], None]:
    """The first `limit` messages of `windows`; the reads behind them stop there."""
    async with contextlib.aclosing(windows):
        remaining = limit
        async for window in windows:
            yield window[:remaining]
            remaining -= len(window)
            if remaining <= 0:
                return


def hidden_ids(records: Sequence[SpanRecord]) -> set[str]:
    return {overlay_id(record) for record in records}


def _hidden_row_ids(conn: Connection, session_id: str) -> set[str]:
    """The ids a row of the session is hidden under (its compactions' overlay ids), read without
    the records' summaries: reads that only skip hidden rows read ids alone."""
    return {COMPACTION_PREFIX + record_id for record_id in queries.compaction_ids(conn, session_id)}


def resolve_leaf(store: ObjectStore, conn: Connection, session_id: str, leaf_id: str) -> str | None:
    """A non-empty leaf id is used only if it exists in the session (else the read is empty);
    an empty one means the active leaf. Path reads then treat an empty-string leaf (a message
    whose id is "") as no leaf, as upstream's truthiness test does; newest-first walks from it."""
    if leaf_id:
        return leaf_id if queries.exists(conn, session_id, leaf_id) else None
    return store.latest_leaf_id(conn, session_id)


def cut_windows(
    rows: Sequence[PathStat], max_rows: int, max_bytes: int, *, grow_to: int = 0
) -> list[Sequence[PathStat]]:
    """Cuts rows into hydration windows: at most `max_rows` (doubling after each window up to
    `grow_to` when given), and at most `max_bytes` of stored bytes, a single oversized row
    standing alone."""
    # Cut points come from running byte totals by bisection: a remembered read of a long path
    # spends no Python per row here.
    totals = [0, *accumulate(map(STORED_BYTES, rows))]
    out: list[Sequence[PathStat]] = []
    start = 0
    while start < len(rows):
        end = min(len(rows), start + max_rows)
        fits = bisect_right(totals, totals[start] + max_bytes, start + 1, end + 1) - 1
        end = max(start + 1, fits)
        out.append(rows[start:end])
        start = end
        max_rows = max(max_rows, min(max_rows * 2, grow_to))
    return out


def cut_windows_from_end(
    rows: Sequence[PathStat], max_rows: int, max_bytes: int, *, grow_to: int = 0
) -> Iterator[Sequence[PathStat]]:
    """`cut_windows` of the rows newest first, cut lazily from the end: a reader that stops after a
    few messages pays for their windows only, however long the path."""
    end = len(rows)
    while end > 0:
        start = end - 1
        stored = rows[start].bytes
        floor = max(0, end - max_rows)
        while start > floor and stored + rows[start - 1].bytes <= max_bytes:
            start -= 1
            stored += rows[start].bytes
        yield rows[start:end][::-1]
        end = start
        max_rows = max(max_rows, min(max_rows * 2, grow_to))


def _planned(
    store: ObjectStore,
    session_id: str,
    attempt: Callable[[Connection, paths.WalkStamp, int | None], T],
    conn: Connection,
) -> T:
    """A read's plan, and its first window, in one snapshot: `attempt(conn, stamp, epoch)` with
    the memo, when it agrees with the snapshot (`epoch`, see `ObjectStore.memo_epoch`), else (or
    when a commit came while it consulted the memo) `attempt(conn, stamp, None)` from storage."""
    stamp = paths.walk_stamp(store, session_id)  # before the snapshot
    return _with_memo(store, conn, functools.partial(attempt, conn, stamp))


def _with_memo(store: ObjectStore, conn: Connection, attempt: Callable[[int | None], T]) -> T:
    """Call before the read's first statement (its snapshot begins there)."""
    epoch = store.memo_epoch
    if not epoch & 1:  # every commit so far noted: the memo is the state the snapshot will have
        result = attempt(epoch)
        if store.memo_epoch == epoch:  # and no commit came while it was consulted
            return result
    return attempt(None)


@dataclass(slots=True)
class _Share:
    """Whether a path's messages may be remembered (`paths.fits_session_share`), decided at its
    first storage read: the sum runs over the whole path, which a read of remembered messages
    never needs."""

    stats: Sequence[PathStat]
    fits: bool | None = None

    def remember(self) -> bool:
        if self.fits is None:
            self.fits = paths.fits_session_share(sum(map(STORED_BYTES, self.stats)), len(self.stats))
        return self.fits


# One window of a path read: an overlay's record, or a run of rows (record None).
_Window = tuple[SpanRecord | None, Sequence[PathStat]]


@dataclass(slots=True)
class _Started:
    """A path read's first window, read in the snapshot of its plan, and the windows after it."""

    views: list[MessageView] = field(default_factory=list)
    rest: Iterator[_Window] = field(default_factory=lambda: iter(()))
    share: _Share = field(default_factory=lambda: _Share(()))


# A newest-first read's start: the leaf, the session's compaction records, and either the
# remembered path with its first window read, or the walk's first step.
_LeafStart = tuple[str | None, list[CompactionSpan], tuple[list[PathStat], _Started] | None, _WalkStep | None]


def _start_path(
    conn: Connection,
    store: ObjectStore,
    session_id: str,
    stats: Sequence[PathStat],
    records: Sequence[CompactionSpan],
    spans: Sequence[OverlaySpan] | None,
    *,
    newest_first: bool = False,
    inline: bool,
    epoch: int | None,
    stamp: paths.WalkStamp,
) -> _Started:
    """Cuts a path into windows, overlays collapsed, and reads the first in this snapshot (its
    remembered messages only when `epoch` says the memo agrees with it). A path whose messages
    are all remembered comes as one window: it is in memory already."""
    if spans is None:
        spans = plan_overlays(list(map(ROW_ID, stats)), records) if records else []
    share = _Share(stats)
    if epoch is not None and not spans and not newest_first:
        in_memory = paths.path_views(store, session_id, stats)
        if in_memory is not None:
            return _Started(in_memory, iter(()), share)
    pending = _windows(stats, spans, newest_first)
    while (window := next(pending, None)) is not None:
        record, rows = window
        if record is not None:
            overlay = _overlay_in(conn, session_id, record)
            if overlay is not None:
                return _Started([overlay], pending, share)
            continue
        if sum(map(STORED_BYTES, rows)) > QUICK_WINDOW_BYTES:
            store.read_on_executor(conn)  # as `_stream` reads such a window
        views, unread, as_stored = _read_rows(conn, store, session_id, rows, inline, epoch, share.remember())
        if as_stored:
            paths.remember_views(store, session_id, stamp.version, as_stored)
        if unread:
            pending = chain([(None, unread)], pending)
        if views:
            return _Started(views, pending, share)
    return _Started([], pending, share)


def _windows(stats: Sequence[PathStat], spans: Sequence[OverlaySpan], newest_first: bool) -> Iterator[_Window]:
    """The windows of a path in the order they are sent: each overlay alone, and the rows between
    cut into hydration windows (newest first: lazily from the end)."""
    segments: list[_Window] = []
    index = 0
    for span in sorted(spans, key=_SPAN_START):
        if span.start < index:
            continue  # inside an overlay already taken
        if span.start > index:
            segments.append((None, stats[index : span.start]))
        segments.append((span.compaction, ()))
        index = span.end + 1
    if index < len(stats):
        segments.append((None, stats[index:]))
    if newest_first:
        segments.reverse()
    for record, segment in segments:
        if record is not None:
            yield record, ()
            continue
        windows: Iterable[Sequence[PathStat]] = (
            cut_windows_from_end(segment, NEWEST_FIRST_WINDOW_ROWS, WINDOW_BYTES, grow_to=WINDOW_MAX_ROWS)
            if newest_first
            else cut_windows(segment, WINDOW_ROWS, WINDOW_BYTES, grow_to=WINDOW_MAX_ROWS)
        )
        for rows in windows:
            yield None, rows


async def _stream(
    store: ObjectStore, session_id: str, started: _Started, *, inline: bool
) -> AsyncGenerator[list[MessageView], None]:
    """Streams a path read's windows, yielding each whole (an overlay alone): the first, read
    with the plan, then each of the rest in a snapshot of its own; none is retained after it
    has been yielded. A window whose messages are all remembered comes from memory when no
    commit waits for its bookkeeping (the memo is then the latest state). An overlay's summary
    is read (by id) as the overlay is sent, and one whose record is gone by then (a clear) is
    left out, as a message deleted during a read is."""
    first, started.views = started.views, []  # not held while later windows are read
    if first:
        yield first
    del first
    for record, window in started.rest:
        if record is not None:
            overlay = await _overlay_view(store, session_id, record)
            if overlay is not None:
                yield [overlay]
            continue
        rows = window
        while rows:  # more than once only when payloads read back larger than stored
            epoch = store.memo_epoch
            if not epoch & 1:
                remembered, missing, _ = paths.remembered_views(store, session_id, list(map(ROW_ID, rows)))
                if not missing and store.memo_epoch == epoch:
                    yield remembered  # type: ignore[misc]  # no None left
                    break
            version = paths.session_version(store, session_id)  # before the snapshot
            remember = started.share.remember()
            read = functools.partial(
                _window_read, store=store, session_id=session_id, rows=rows, inline=inline, remember=remember
            )
            quick = sum(map(STORED_BYTES, rows)) <= QUICK_WINDOW_BYTES
            views, rows, as_stored = await store.read(read, quick=quick, kind="window")
            if as_stored:
                paths.remember_views(store, session_id, version, as_stored)
            if views:
                yield views


def _window_read(
    conn: Connection, store: ObjectStore, session_id: str, rows: Sequence[PathStat], inline: bool, remember: bool
) -> tuple[list[MessageView], Sequence[PathStat], list[MessageView]]:
    """One window in one snapshot (`_read_rows`), with the memo's messages where it agrees."""
    return _with_memo(store, conn, lambda epoch: _read_rows(conn, store, session_id, rows, inline, epoch, remember))


def _read_rows(
    conn: Connection,
    store: ObjectStore,
    session_id: str,
    rows: Sequence[PathStat],
    inline: bool,
    epoch: int | None,
    remember: bool,
) -> tuple[list[MessageView], Sequence[PathStat], list[MessageView]]:
    """A window's messages in order (those that read as messages), remembered ones from the memo
    when `epoch` is given, the rest read here; the rows left for the next read (when payloads
    read back larger than stored end the window early); and, when `remember`, the views read as
    stored, for the memo: in a list of their own on each run, as a quick read stopped in place
    runs again."""
    ids = list(map(ROW_ID, rows))
    remembered: list[MessageView | None]
    if epoch is not None:
        remembered, missing, _ = paths.remembered_views(store, session_id, ids)
    else:
        remembered, missing = [None] * len(ids), ids
    as_stored: list[MessageView] = []
    found: dict[str, MessageView] = {}
    answered = 0
    if missing:
        found, answered = views_by_id(conn, session_id, missing, inline, WINDOW_BYTES, as_stored if remember else None)
    # Up to the first missing message the read did not answer.
    end = len(ids) if answered == len(missing) else ids.index(missing[answered])
    views = [
        found.get(message_id) if view is None else view
        for message_id, view in zip(ids[:end], remembered[:end], strict=True)
    ]
    # Without the rows reads skip (unparseable).
    return [view for view in views if view is not None], rows[end:], as_stored


def _overlay_in(conn: Connection, session_id: str, record: SpanRecord) -> MessageView | None:
    """An overlay's synthetic message, its summary read in this snapshot; None when the record
    is gone."""
    summary = queries.compaction_summary(conn, session_id=session_id, compaction_id=record.id)
    return None if summary is None else _overlay_message(record, summary)


async def _overlay_view(store: ObjectStore, session_id: str, record: SpanRecord) -> MessageView | None:
    """The synthetic message of an overlay, its summary read by id now: None when the record is
    gone (a clear since the read planned it). Timed as a kind of its own: a point read of a key,
    in place for a lone caller even after a long walk's reads were sent to the executor."""
    summary = await store.read(
        functools.partial(queries.compaction_summary, session_id=session_id, compaction_id=record.id),
        quick=True,
        kind=SUMMARY_READ,
    )
    return None if summary is None else _overlay_message(record, summary)


def _overlay_message(record: SpanRecord, summary: str) -> MessageView:
    return MessageView(
        RowInfo(overlay_id(record), "assistant", None, 0, 0, 0), overlay_message_json(record, summary), overlay=True
    )


class BatchMarker:
    """Pairs each message with whether it ends a batch, by upstream's historyBatches rules: close
    the batch before a message that would overflow it, and after one that fills it. Fed a window
    at a time; the last message of a window waits for the next (or `finish`) when its batch could
    still close before it."""

    def __init__(self, batch_size: int, max_batch_bytes: int) -> None:
        self.size_limit = max(1, batch_size)
        self.byte_limit = max(1, max_batch_bytes)
        self.count = 0
        self.used = 0
        self.previous: MessageView | None = None

    def mark(self, views: Sequence[MessageView]) -> list[tuple[MessageView, bool]]:
        out: list[tuple[MessageView, bool]] = []
        for view in views:
            size = utf8_length(view.json)
            if self.previous is not None:
                closes = self.count >= self.size_limit or self.used + size > self.byte_limit
                out.append((self.previous, closes))
                if closes:
                    self.count, self.used = 0, 0
            self.count += 1
            self.used += size
            self.previous = view
            if self.count >= self.size_limit or self.used >= self.byte_limit:
                out.append((view, True))
                self.previous = None
                self.count, self.used = 0, 0
        return out

    def finish(self) -> list[tuple[MessageView, bool]]:
        last, self.previous = self.previous, None
        return [] if last is None else [(last, True)]
