"""Reading a session's paths: root-to-leaf reads, newest-first walks, budgeted recent windows,
row statistics, the active leaf and branches, with compaction overlays collapsed.

Reads hydrate in bounded windows and yield each as it is read, so no read holds a whole
transcript; a path the memo remembers (`paths`) is served from memory.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from bisect import bisect_right
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

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
    store: ObjectStore, session_id: str, ids: Sequence[str], inline: bool
) -> AsyncGenerator[list[MessageView], None]:
    """The messages of `ids` (distinct) that exist, in that order, a window a read: at most
    WINDOW_ROWS rows and WINDOW_BYTES of stored bytes (a larger message alone), sized before they
    are read, so that no read holds more than a window of them however large they are; a window
    whose payloads read back larger ends after the message that passes WINDOW_BYTES. Past the
    first, windows double up to WINDOW_MAX_ROWS rows, as a history read's do."""
    start, rows = 0, WINDOW_ROWS
    while start < len(ids):
        candidates = ids[start : start + rows]

        def read(conn: Connection, candidates: Sequence[str] = candidates) -> tuple[int, dict[str, MessageView]]:
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

        taken, found = await store.read(read, quick=not large_messages.any_known_large(store, session_id, candidates))
        for message_id, view in found.items():
            large_messages.note_read(store, session_id, message_id, len(view.json))
        yield [found[message_id] for message_id in candidates[:taken] if message_id in found]
        start += taken
        rows = min(rows * 2, WINDOW_MAX_ROWS)


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

    def plan(conn: Connection) -> tuple[list[PathStat], list[CompactionSpan], list[OverlaySpan] | None]:
        stamp = paths.walk_stamp(store, session_id)  # before the snapshot
        leaf = resolve_leaf(store, conn, session_id, leaf_id)
        if not leaf:  # an empty id as the leaf reads as no leaf, as upstream
            return [], [], []
        records = queries.compaction_spans(conn, session_id)
        remembered = paths.remembered_overlaid_path(store, session_id, leaf, records) if records else None
        if remembered is not None:
            return remembered[0], records, remembered[1]
        return paths.path_stats(store, conn, session_id, leaf, stamp).rows, records, None

    # In place for a lone caller: a remembered path (an agent's read after its append) costs
    # point reads; a walk that outlasts a quick read (a long session's) runs again on the executor.
    stats, records, spans = await store.read(plan, quick=True)
    async for window in stream_path(store, session_id, stats, records, spans=spans, inline=inline):
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

    def plan(conn: Connection) -> _RecentPlan:
        stamp = paths.walk_stamp(store, session_id)  # before the snapshot
        leaf = resolve_leaf(store, conn, session_id, leaf_id)
        if not leaf:  # an empty id as the leaf reads as no leaf, as upstream
            return [], False, 0, []
        # The remembered path gives the suffix without a pass over the path; else the walk,
        # which is then remembered.
        suffix = paths.remembered_suffix(store, session_id, leaf, max_content_bytes)
        if suffix is None:
            suffix = paths.suffix_of(paths.path_stats(store, conn, session_id, leaf, stamp), max_content_bytes)
        return planned(conn, suffix)

    # In place for a lone caller, as a root-first read's plan: a walk that outlasts a quick
    # read (a long session's) runs again on the executor.
    plan_read = await store.read(plan, quick=True)
    window, truncated, total, records = plan_read
    yield RecentSummary(truncated, total)
    async for views in stream_path(store, session_id, window, records, inline=inline):
        yield views


async def from_leaf(
    store: ObjectStore, session_id: str, leaf_id: str, inline: bool, limit: int = 0
) -> AsyncGenerator[list[MessageView], None]:
    """Leaf to root along the parent pointers, a few rows per read (one statement); switches
    to planned overlays at the first row that ends some compaction (everything after it is
    exact without planning).
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
            if row.info.id in span_ends:
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

    def start(conn: Connection) -> tuple[str | None, list[CompactionSpan], _Remembered | None, _WalkStep | None]:
        leaf = resolve_leaf(store, conn, session_id, leaf_id)
        records = queries.compaction_spans(conn, session_id)
        remembered: _Remembered | None = None
        if leaf and records:  # overlays are planned over the whole path, once while it is remembered
            remembered = paths.remembered_overlaid_path(store, session_id, leaf, records)
        elif leaf:  # without any, the newest rows suffice
            rows = paths.remembered_path(store, session_id, leaf, wanted)
            remembered = None if rows is None else (rows, [])
        # Before the return below too: a walk from a leaf whose id is "" switches to overlays.
        span_ends.update(record.to_message_id for record in records)
        hidden.update(hidden_ids(records))
        if not leaf or remembered is not None:
            return leaf, records, remembered, None
        return leaf, records, None, walk(conn, leaf, min(WALK_FIRST_STEPS, wanted), 0)

    leaf, records, path, step = await store.read(start, quick=True)
    next_id = leaf
    depth = 0
    if path is not None:  # no walk: the path's messages are likely remembered too
        remembered, spans = path
        asked = wanted
        windows = stream_path(store, session_id, remembered, records, newest_first=True, spans=spans, inline=inline)
        async for window in windows:
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
    def visible_path(conn: Connection) -> list[PathStat]:
        stamp = paths.walk_stamp(store, session_id)  # before the snapshot
        return [] if not leaf else paths.path_stats(store, conn, session_id, leaf, stamp).rows  # "": as upstream

    # With each row's stored bytes, so that windows keep to WINDOW_BYTES. A walk that outlasts a
    # quick read runs again on the executor.
    rows = await store.read(visible_path, quick=True)
    path = [row.id for row in rows]
    if from_id not in path:
        return
    end = path.index(from_id)
    spans = [span for span in plan_overlays(path, records) if span.end <= end]
    stats = rows[: end + 1]
    async for window in stream_path(store, session_id, stats, records, newest_first=True, spans=spans, inline=inline):
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


async def stream_path(
    store: ObjectStore,
    session_id: str,
    stats: Sequence[PathStat],
    records: Sequence[CompactionSpan],
    *,
    newest_first: bool = False,
    spans: Sequence[OverlaySpan] | None = None,
    inline: bool = True,
) -> AsyncGenerator[list[MessageView], None]:
    """Streams path rows with overlays collapsed, hydrating one bounded window at a time and
    yielding it whole (an overlay alone); no window is retained after it has been yielded. A
    path whose messages are all remembered comes as one window: it is in memory already. An
    overlay's summary is read (by id) as the overlay is sent, and one whose record is gone by
    then (a clear) is left out, as a message deleted during a read is."""
    if spans is None:
        spans = plan_overlays(list(map(ROW_ID, stats)), records) if records else []
    if not spans and not newest_first:
        in_memory = paths.path_views(store, session_id, stats)
        if in_memory is not None:
            yield in_memory  # one window: framing cuts it into responses as they go out
            return
    # A path too large to remember is streamed without filling the memo (and evicting others).
    # Decided at the first storage read: the sum runs over the whole path, which a newest-first
    # read of remembered messages never needs.
    remember: bool | None = None
    # Each segment: an overlay's record, or a run of rows.
    segments: list[tuple[SpanRecord | None, Sequence[PathStat]]] = []
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
            overlay = await _overlay_view(store, session_id, record)
            if overlay is not None:
                yield [overlay]
            continue
        windows: Iterable[Sequence[PathStat]] = (
            cut_windows_from_end(segment, NEWEST_FIRST_WINDOW_ROWS, WINDOW_BYTES, grow_to=WINDOW_MAX_ROWS)
            if newest_first
            else cut_windows(segment, WINDOW_ROWS, WINDOW_BYTES, grow_to=WINDOW_MAX_ROWS)
        )
        for window in windows:
            ids = list(map(ROW_ID, window))
            quick = sum(map(STORED_BYTES, window)) <= QUICK_WINDOW_BYTES
            while ids:  # more than once only when payloads read back larger than stored
                remembered, missing, version = paths.remembered_views(store, session_id, ids)
                if not missing:
                    yield remembered  # type: ignore[misc]  # no None left
                    break
                if remember is None:
                    remember = paths.fits_session_share(sum(map(STORED_BYTES, stats)), len(stats))
                found, as_stored, answered = await store.read(
                    functools.partial(
                        _window_views, session_id=session_id, ids=missing, inline=inline, remember=remember
                    ),
                    quick=quick,
                    kind="window",
                )
                if as_stored:
                    paths.remember_views(store, session_id, version, as_stored)
                # Up to the first missing message the read did not answer.
                end = len(ids) if answered == len(missing) else ids.index(missing[answered])
                views = [
                    found.get(message_id) if view is None else view
                    for message_id, view in zip(ids[:end], remembered[:end], strict=True)
                ]
                kept = [view for view in views if view is not None]  # without the rows reads skip (unparseable)
                if kept:
                    yield kept
                ids = ids[end:]


async def _overlay_view(store: ObjectStore, session_id: str, record: SpanRecord) -> MessageView | None:
    """The synthetic message of an overlay, its summary read by id now: None when the record is
    gone (a clear since the read planned it). Timed as a kind of its own: a point read of a key,
    in place for a lone caller even after a long walk's reads were sent to the executor."""
    summary = await store.read(
        functools.partial(queries.compaction_summary, session_id=session_id, compaction_id=record.id),
        quick=True,
        kind=SUMMARY_READ,
    )
    if summary is None:
        return None
    return MessageView(
        RowInfo(overlay_id(record), "assistant", None, 0, 0, 0), overlay_message_json(record, summary), overlay=True
    )


def _window_views(
    conn: Connection, session_id: str, ids: list[str], inline: bool, remember: bool
) -> tuple[dict[str, MessageView], list[MessageView], int]:
    """A window's views by id, and, when `remember`, those read as stored (for the memo): in a
    list of its own on each run, as a quick read stopped in place runs again; and how many of
    `ids` they answer."""
    as_stored: list[MessageView] = []
    views, answered = views_by_id(conn, session_id, ids, inline, WINDOW_BYTES, as_stored if remember else None)
    return views, as_stored, answered


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
