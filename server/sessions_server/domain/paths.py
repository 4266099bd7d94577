"""A memo of recently walked session paths (root to a leaf, as row stats) and of their
messages, per open object.

Walking a path costs a point read per row, and an agent reads its whole history after nearly
every append. Appends change no existing path but one that stops at a missing parent (imported
rows may name one), which a row appended under that id joins to a root: such a path is walked
again (`open_parent`), and a walk of one is not kept if any append committed while it ran. Else
a new row only extends the path of its parent; an update rewrites one row and moves none. So a
remembered path is extended by appends to its leaf, restated in place by an update (an agent
streams its answer by upserts, then appends), and dropped by every other change to the session
(delete, clear, compaction, import). Readers get a copy; a walk that raced with a change is not
remembered (the session's version moved while it ran).

The messages (views) read along a path are remembered the same way: a message's stored form
changes only by an update, which replaces it, or by a delete, clear, compaction or import, each
of which forgets the whole session; an append only adds one. A read then streams the remembered
messages without a storage read, and the transport keeps its encoding of each on the view, so it
is built once.
Only rows read as stored are kept (not those whose attachments were restored into them). Once
every message of a remembered path is remembered, the path also keeps them in its order (and
appends extend that list): a read of it then costs nothing per message. The overlays planned over
a remembered path are kept with it too (`remembered_overlaid_path`).

Memory is bounded for the whole process: at most MAX_REMEMBERED_PATH_BYTES of row stats and
MAX_VIEW_BYTES of message JSON (counted twice, for its encoding) in all, least recently used
sessions dropped first; a session whose messages would take more than MAX_SESSION_VIEW_BYTES
is not kept. Hooks run on the event loop and lookups on reader threads or the loop, all under
one lock (each holds it for a dictionary operation or a list copy).
"""

from __future__ import annotations

import functools
import operator
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import NamedTuple, cast

from sessions_server.domain.overlays import OverlaySpan, plan_overlays
from sessions_server.domain.views import MessageView, Rewrites
from sessions_server.storage import queries
from sessions_server.storage.queries import CompactionSpan, Connection
from sessions_server.storage.rows import (
    MAX_PATH_DEPTH,
    PathStat,
    PathStats,
    RowInfo,
    held_bytes,
    utf8_length,
)
from sessions_server.storage.store import ObjectStore

MEMO_KEY = "paths"
ROW_ID = operator.attrgetter("id")
STORED_BYTES = operator.attrgetter("bytes")
# A row stat with its id and role string objects costs ROW_STAT_BYTES and their characters
# (measured: 317 bytes in all with a UUID id and "assistant"), and a remembered path's own
# entry (its record, its key, the dictionary slot) about PATH_OVERHEAD_BYTES more. Counted in
# bytes, not rows: ids and roles may each take 16 KiB, and 20,000 such rows held 633 MB when a
# row was taken to cost 200 bytes. 64 MiB holds some 210,000 rows of the usual kind (21
# sessions at the 10,001-row depth cap).
MAX_REMEMBERED_PATH_BYTES = 64 * 1024 * 1024
ROW_STAT_BYTES = 275
PATH_OVERHEAD_BYTES = 400
# Sessions whose last change an open object remembers (see `_ObjectMemo`).
MAX_VERSIONED_SESSIONS = 4096
DEFAULT_MESSAGE_BUDGET_BYTES = 96 * 1024 * 1024
MAX_VIEW_BYTES = DEFAULT_MESSAGE_BUDGET_BYTES
MAX_SESSION_VIEW_BYTES = MAX_VIEW_BYTES // 3
# What a remembered message costs beyond its JSON and encoding (the view, its info, the dict).
VIEW_OVERHEAD_BYTES = 400


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class AppendedRow:
    """A committed append as the memo needs it: `bytes` is None when it references attachments
    (their payloads count too, and are not known here)."""

    info: RowInfo
    bytes: int | None
    view: MessageView | None = None  # what a read returns for it, when that is the stored JSON


@dataclass(slots=True)
class PathSuffix:
    """The newest rows of a path within a byte budget (`rows`, oldest first), whether older rows
    were left out, and the whole path's stored bytes, walked rows and oldest row."""

    rows: list[PathStat]
    cut: bool
    stored_bytes: int
    walked: int
    oldest_id: str | None


@dataclass(slots=True)
class _Overlays:
    """The overlays planned over a remembered path, for the records (by id) they were planned
    with. An append keeps them unless it ends some record's span (which may then apply) or
    pushes a row out at the walk's cap (every index moves); records change only by writes that
    forget the path. The spans' records hold no summaries (`CompactionSpan`): a read reads an
    overlay's summary as it sends it, so what is kept here is ids and spans alone."""

    record_ids: tuple[str, ...]
    span_ends: frozenset[str]
    spans: list[OverlaySpan]


@dataclass(slots=True)
class _Path:
    leaf_id: str
    rows: list[PathStat]
    walked: int
    oldest_id: str | None
    # The rows' stored bytes in all, kept as rows come and go: a budgeted read of the newest
    # rows reports it without a pass over the path.
    stored_bytes: int = 0
    # The rows' messages in path order, once every one is remembered: a read then takes them
    # without a lookup per message. Cleared whenever the session's messages are dropped.
    views: list[MessageView] | None = None
    overlays: _Overlays | None = None
    # The missing parent the walk stopped at (`PathStats.open_parent`): a row appended under
    # that id joins the path's root to its leaf, and the path is walked again.
    open_parent: str | None = None
    # What the path is charged against MAX_REMEMBERED_PATH_BYTES, kept as rows come and go.
    cost: int = PATH_OVERHEAD_BYTES

    def stats(self) -> PathStats:
        return PathStats(list(self.rows), self.walked, self.oldest_id, open_parent=self.open_parent)


@dataclass(eq=False)
class _ObjectMemo:
    """One open object's part: the key of its paths (by identity), its sessions' versions, and
    the sessions it has entries for.

    A session's version is the stamp of its last change other than appends, from one counter
    of the object, so versions only ever grow: the newest MAX_VERSIONED_SESSIONS are kept, and
    every other session reads as `floor`, the newest stamp let go. A read that took a version
    before a change never finds it again after (a per-session count, forgotten and started
    again, could), and the memo stays bounded in a long-open object with ever new sessions."""

    versions: OrderedDict[str, int] = field(default_factory=OrderedDict)
    counter: int = 0
    floor: int = 0
    sessions: set[str] = field(default_factory=set)  # with a path or messages remembered
    appends: int = 0  # commits of appends noted, any session's

    def version(self, session_id: str) -> int:
        return self.versions.get(session_id, self.floor)

    def changed(self, session_id: str) -> None:
        self.counter += 1
        self.versions.pop(session_id, None)
        self.versions[session_id] = self.counter
        while len(self.versions) > MAX_VERSIONED_SESSIONS:
            _, stamp = self.versions.popitem(last=False)
            self.floor = max(self.floor, stamp)


@dataclass(slots=True)
class _Views:
    by_id: dict[str, MessageView] = field(default_factory=dict)
    bytes: int = 0
    rewrites: Rewrites = field(default_factory=Rewrites)  # shared by every view in `by_id`


_lock = threading.Lock()
_paths: OrderedDict[tuple[_ObjectMemo, str], _Path] = OrderedDict()  # least recently used first
_path_bytes = 0
_views: OrderedDict[tuple[_ObjectMemo, str], _Views] = OrderedDict()  # least recently used first
_view_bytes = 0


def remembered_bytes() -> tuple[int, int]:
    """What the process remembers now, as charged against its budgets: (paths, messages)."""
    return _path_bytes, _view_bytes


def _object_memo(store: ObjectStore) -> _ObjectMemo:
    memo = store.memo.get(MEMO_KEY)
    if not isinstance(memo, _ObjectMemo):
        candidate = _ObjectMemo()
        memo = store.memo.setdefault(MEMO_KEY, candidate)  # atomic: reader threads race here
        if memo is candidate:
            store.on_close(functools.partial(forget_object, memo))
    return cast(_ObjectMemo, memo)


def row_cost(row: PathStat) -> int:
    """What a remembered row stat takes in memory, erring high: an interned id is charged to
    each path holding it, and text not all ASCII at four bytes a character, the most Python
    takes (`sys.getsizeof` is exact, but three times slower over a 10,000-row walk)."""
    return ROW_STAT_BYTES + _characters_bytes(row.id) + _characters_bytes(row.role)


def _characters_bytes(text: str) -> int:
    return len(text) if text.isascii() else 4 * len(text)


def _drop(key: tuple[_ObjectMemo, str]) -> None:
    global _path_bytes
    held = _paths.pop(key, None)
    if held is not None:
        _path_bytes -= held.cost
        if key not in _views:
            key[0].sessions.discard(key[1])


def _charge(held: _Path, cost: int) -> None:
    """A change of a held path's cost, charged at once: `_drop` takes back what it holds then."""
    global _path_bytes
    held.cost += cost
    _path_bytes += cost


def _keep(key: tuple[_ObjectMemo, str], path: _Path) -> None:
    global _path_bytes
    _drop(key)
    if path.cost > MAX_REMEMBERED_PATH_BYTES:  # kept, it would push every other path out, then itself
        return
    _paths[key] = path
    key[0].sessions.add(key[1])
    _path_bytes += path.cost
    _trim()


def _trim() -> None:
    """Drops the least recently used paths until what is kept fits the budget."""
    while _path_bytes > MAX_REMEMBERED_PATH_BYTES and _paths:
        _drop(next(iter(_paths)))


def session_version(store: ObjectStore, session_id: str) -> int:
    """The session's version, for a read to take before its snapshot begins (before its first
    statement): what it walks is remembered only if no change was forgotten since. Taken after,
    a change that committed after the snapshot but was forgotten before the version was read
    left the walk of the older snapshot remembered as current (a deleted message read again
    and again, until the session's next change other than an append)."""
    memo = _object_memo(store)
    with _lock:
        return memo.version(session_id)


class WalkStamp(NamedTuple):
    """What a read takes before its snapshot, for its walk to be remembered only if still
    current: the session's version, and the object's count of noted appends."""

    version: int
    appends: int


def walk_stamp(store: ObjectStore, session_id: str) -> WalkStamp:
    """`session_version`, and the appends noted so far: a walk that stops at a missing parent
    is stale once a row appended under that id committed, though the version did not move."""
    memo = _object_memo(store)
    with _lock:
        return WalkStamp(memo.version(session_id), memo.appends)


def path_stats(
    store: ObjectStore, conn: Connection, session_id: str, leaf_id: str, stamp: WalkStamp, *, remembered: bool = True
) -> PathStats:
    """The session's path to `leaf_id`, from the memo when it holds that leaf and `remembered`
    (the memo agrees with the read's snapshot) (runs on a reader thread); a walk is remembered
    if the session is still at the version of `stamp` (taken before the read's snapshot) and,
    for a walk that stopped at a missing parent, no append was noted since. The caller owns the
    returned rows."""
    memo = _object_memo(store)
    key = (memo, session_id)
    if remembered:
        with _lock:
            held = _held_path(key, leaf_id)
            if held is not None:
                return held.stats()
    stats = queries.path_stats(conn, session_id, leaf_id)
    # Ids are interned here and where messages are remembered, so a read's lookups of a long
    # remembered path match by identity instead of comparing thousands of strings.
    for row in stats.rows:
        row.id = sys.intern(row.id)
    # A path that passes a row twice (imported rows in a cycle) is not kept: an update of that
    # row would have to restate it wherever it stands.
    cyclic = len(set(map(ROW_ID, stats.rows))) != len(stats.rows)
    cost = PATH_OVERHEAD_BYTES + sum(map(row_cost, stats.rows))  # outside the lock: 0.9 ms a 10,000 rows
    with _lock:
        # A walk that stopped at a missing parent, with an append committed meanwhile: that row
        # may be the parent, noted (`note_appends`) before this walk was kept to be dropped.
        overtaken = stats.open_parent is not None and memo.appends != stamp.appends
        if memo.version(session_id) == stamp.version and not stats.dangling and not cyclic and not overtaken:
            stored = sum(map(STORED_BYTES, stats.rows))
            _keep(
                key,
                _Path(
                    leaf_id,
                    list(stats.rows),
                    stats.walked,
                    stats.oldest_id,
                    stored,
                    open_parent=stats.open_parent,
                    cost=cost,
                ),
            )
    return stats


def budget_start(rows: Sequence[PathStat], max_bytes: int) -> int:
    """Where the newest rows whose stored bytes fit `max_bytes` begin: never after the last row
    (the leaf is taken whatever its size). Costs the rows taken, not the path."""
    start = len(rows) - 1
    if start <= 0:
        return 0
    used = rows[start].bytes
    while start > 0 and used + rows[start - 1].bytes <= max_bytes:
        start -= 1
        used += rows[start].bytes
    return start


def suffix_of(stats: PathStats, max_bytes: int) -> PathSuffix:
    """`stats`' newest rows within `max_bytes` (a pass over the path for its stored bytes)."""
    start = budget_start(stats.rows, max_bytes)
    return PathSuffix(stats.rows[start:], start > 0, sum(map(STORED_BYTES, stats.rows)), stats.walked, stats.oldest_id)


def remembered_suffix(store: ObjectStore, session_id: str, leaf_id: str, max_bytes: int) -> PathSuffix | None:
    """The remembered path to `leaf_id`, as `suffix_of` gives it but with no pass over the path;
    None when it is not remembered."""
    with _lock:
        held = _held_path((_object_memo(store), session_id), leaf_id)
        if held is None:
            return None
        start = budget_start(held.rows, max_bytes)
        return PathSuffix(held.rows[start:], start > 0, held.stored_bytes, held.walked, held.oldest_id)


def remembered_path(store: ObjectStore, session_id: str, leaf_id: str, last: int = 0) -> list[PathStat] | None:
    """The remembered path to `leaf_id` (a copy), or None: never walks. `last` (0: all) copies
    only that many rows at the leaf's end, so a reader of the newest few pays for those."""
    with _lock:
        held = _held_path((_object_memo(store), session_id), leaf_id)
        if held is None:
            return None
        return held.rows[-last:] if 0 < last < len(held.rows) else list(held.rows)


def remembered_overlaid_path(
    store: ObjectStore, session_id: str, leaf_id: str, records: Sequence[CompactionSpan]
) -> tuple[list[PathStat], list[OverlaySpan]] | None:
    """The remembered path to `leaf_id` (a copy) and the overlays `records` apply to it, planned
    once for the path and kept with it (a newest-first read of 50 messages planned a
    10,000-row path every time; the spans are shared, not to be changed); None when the path
    is not remembered."""
    record_ids = tuple(record.id for record in records)
    key = (_object_memo(store), session_id)
    with _lock:
        held = _held_path(key, leaf_id)
        if held is None:
            return None
        rows = list(held.rows)
        planned = held.overlays
        if planned is not None and planned.record_ids == record_ids:
            return rows, planned.spans
    spans = plan_overlays(list(map(ROW_ID, rows)), records)  # outside the lock: it takes a while
    with _lock:
        if _paths.get(key) is held and held.leaf_id == leaf_id:  # the same ids (an update moves none)
            held.overlays = _Overlays(record_ids, frozenset(record.to_message_id for record in records), spans)
    return rows, spans


def _held_path(key: tuple[_ObjectMemo, str], leaf_id: str) -> _Path | None:
    """The remembered path to `leaf_id`, marked recently used; call with `_lock` held."""
    held = _paths.get(key)
    if held is None or held.leaf_id != leaf_id:
        return None
    _paths.move_to_end(key)
    return held


def note_appends(store: ObjectStore, session_id: str, appended: Sequence[AppendedRow]) -> list[int] | None:
    """Extends the remembered path by committed appends to its leaf (in commit order); an append
    elsewhere moves the active leaf away from it, which makes it useless: it is dropped. Returns
    the token estimates of the rows the appends pushed out at the walk's cap, oldest first, or
    None when the path was not remembered through every append."""
    key = (_object_memo(store), session_id)
    pushed_out: list[int] = []
    with _lock:
        key[0].appends += 1
        _note_appended_views(key, appended)
        held = _paths.get(key)
        if held is None:
            return None
        for row in appended:
            if row.info.parent_id != held.leaf_id or row.bytes is None or row.info.id == held.open_parent:
                _drop(key)
                return None
            if held.walked > MAX_PATH_DEPTH:
                # The walk is at its cap (MAX_PATH_DEPTH + 1 rows): the new row pushes the oldest
                # out. Which row becomes the oldest is known only if no walked row is hidden.
                if held.walked != len(held.rows):
                    _drop(key)
                    return None
                pushed_out.append(held.rows[0].token_estimate)
                held.overlays = None
                held.stored_bytes -= held.rows[0].bytes
                _charge(held, -row_cost(held.rows[0]))
                del held.rows[0]
                if held.views is not None:
                    del held.views[0]
                held.oldest_id = held.rows[0].id if held.rows else row.info.id
            else:
                held.walked += 1
            info = row.info
            if held.overlays is not None and info.id in held.overlays.span_ends:
                held.overlays = None
            stat = PathStat(sys.intern(info.id), info.role, row.bytes, info.token_estimate)
            held.rows.append(stat)
            held.stored_bytes += row.bytes
            _charge(held, row_cost(stat))
            if held.views is not None:
                if row.view is None:  # read from storage when first read
                    held.views = None
                else:
                    held.views.append(row.view)
            held.leaf_id = info.id
        _keep(key, held)
    return pushed_out


@dataclass(slots=True)
class PathPlace:
    """Where an updated row stood on the remembered path to `leaf_id` before its update: its
    index among the path's rows (None when the path does not pass through it) and the token
    estimate it had there."""

    leaf_id: str
    index: int | None
    old_tokens: int


def note_update(store: ObjectStore, session_id: str, updated: AppendedRow) -> PathPlace | None:
    """An update rewrites one message and moves nothing: the remembered path keeps its rows, the
    updated one restated, and the remembered messages take the new one. Returns where the row
    stood on the remembered path (None when no path is remembered). Reads under way remember
    nothing of what they read before the update."""
    memo = _object_memo(store)
    key = (memo, session_id)
    with _lock:
        memo.changed(session_id)
        _note_updated_view(key, updated)
        held = _paths.get(key)
        if held is None:
            return None
        index = _index_of(held.rows, sys.intern(updated.info.id))
        if index is None:
            return PathPlace(held.leaf_id, None, 0)
        old = held.rows[index]
        place = PathPlace(held.leaf_id, index, old.token_estimate)
        if updated.bytes is None:  # its attachments' bytes count too, and are not known here
            _drop(key)
            return place
        restated = PathStat(old.id, updated.info.role, updated.bytes, updated.info.token_estimate)
        held.rows[index] = restated
        held.stored_bytes += updated.bytes - old.bytes
        if held.views is not None:
            held.views[index].superseded = True
            if updated.view is None:  # read from storage when next read
                held.views = None
            else:
                held.views[index] = updated.view
        _charge(held, row_cost(restated) - row_cost(old))
        if held.cost > MAX_REMEMBERED_PATH_BYTES:  # a longer role: now too large to keep
            _drop(key)
        _trim()
        return place


def _index_of(rows: Sequence[PathStat], interned_id: str) -> int | None:
    """The row's index, searched from the leaf (where a streamed message is rewritten): ids on a
    remembered path are interned, so identity finds them."""
    for index in range(len(rows) - 1, -1, -1):
        if rows[index].id is interned_id:
            return index
    return None


def _note_updated_view(key: tuple[_ObjectMemo, str], updated: AppendedRow) -> None:
    """The session's remembered messages take the updated one in place of the old."""
    global _view_bytes
    held = _views.get(key)
    if held is None:
        return
    held.rewrites.count += 1  # the views around the rewritten one stay: what joined them is stale
    old = held.by_id.pop(updated.info.id, None)
    if old is not None:
        old.superseded = True  # a read under way may hold it still
        cost = view_cost(old)
        held.bytes -= cost
        _view_bytes -= cost
    if updated.view is not None:
        _add_views(key, held, [updated.view])


def forget(store: ObjectStore, session_id: str) -> None:
    """The session changed in a way other than appends: its remembered path and messages may be
    wrong."""
    memo = _object_memo(store)
    with _lock:
        memo.changed(session_id)
        _drop((memo, session_id))
        _drop_views((memo, session_id))


def forget_object(memo: _ObjectMemo) -> None:
    """Drops everything remembered of a closed object (its memo is never consulted again: the
    object opens with a new one), instead of leaving it until newer entries push it out."""
    with _lock:
        for session_id in list(memo.sessions):
            _drop((memo, session_id))
            _drop_views((memo, session_id))
        memo.sessions.clear()
        memo.versions.clear()
        memo.counter += 1
        memo.floor = memo.counter  # a read still under way finds its version gone: keeps nothing


# ── messages ──────────────────────────────────────────────────────────────────────────────────


def view_cost(view: MessageView) -> int:
    """What remembering `view` counts against the budgets: its JSON as text (`held_bytes`) and
    encoded (its UTF-8)."""
    return held_bytes(view.json) + utf8_length(view.json) + VIEW_OVERHEAD_BYTES


def set_message_budget(total_bytes: int) -> None:
    """Sets MAX_VIEW_BYTES (a third of it for any one session; 0 remembers no messages) and drops
    what no longer fits. Process-wide, like the memo: the command line sets it once."""
    global MAX_VIEW_BYTES, MAX_SESSION_VIEW_BYTES
    with _lock:
        MAX_VIEW_BYTES = max(0, total_bytes)
        MAX_SESSION_VIEW_BYTES = MAX_VIEW_BYTES // 3
        for key in [key for key, held in _views.items() if held.bytes > MAX_SESSION_VIEW_BYTES]:
            _drop_views(key)
        _evict_views()


def fits_session_share(stored_bytes: int, count: int) -> bool:
    """Whether `count` messages of `stored_bytes` in all may be remembered for one session."""
    return 2 * stored_bytes + count * VIEW_OVERHEAD_BYTES <= MAX_SESSION_VIEW_BYTES


def _drop_views(key: tuple[_ObjectMemo, str]) -> None:
    global _view_bytes
    held = _views.pop(key, None)
    if held is not None:
        _view_bytes -= held.bytes
    path = _paths.get(key)
    if path is not None:
        path.views = None
    else:
        key[0].sessions.discard(key[1])


def _add_views(key: tuple[_ObjectMemo, str], held: _Views, views: Iterable[MessageView]) -> None:
    """Adds views to a session's part (already in `_views`); drops the part past its limit and
    the least recently used parts past the process budget."""
    global _view_bytes
    for view in views:
        assert view.info is not None
        if view.info.id in held.by_id:
            continue
        cost = view_cost(view)
        if held.bytes + cost > MAX_SESSION_VIEW_BYTES:
            _drop_views(key)
            return
        held.by_id[sys.intern(view.info.id)] = view
        view.rewrites = held.rewrites
        held.bytes += cost
        _view_bytes += cost
    _views.move_to_end(key)
    _evict_views()


def _evict_views() -> None:
    """Drops the least recently used sessions' messages until the rest fit MAX_VIEW_BYTES."""
    while _view_bytes > MAX_VIEW_BYTES and _views:
        _drop_views(next(iter(_views)))


def remembered_views(
    store: ObjectStore, session_id: str, ids: Sequence[str]
) -> tuple[list[MessageView | None], list[str], int]:
    """The remembered message of each of `ids` (None where there is none), the ids that have
    none, and the session's version to remember more under."""
    memo = _object_memo(store)
    key = (memo, session_id)
    with _lock:
        version = memo.version(session_id)
        held = _views.get(key)
        if held is None:
            return [None] * len(ids), list(ids), version
        _views.move_to_end(key)
        views = list(map(held.by_id.get, ids))
    return views, list(compress(ids, map(operator.is_, views, repeat(None)))), version


def path_views(store: ObjectStore, session_id: str, stats: Sequence[PathStat]) -> list[MessageView] | None:
    """The messages of `stats` in order, when `stats` is the remembered path (or its tail) and
    every one of its messages is remembered; else None."""
    key = (_object_memo(store), session_id)
    with _lock:
        held = _paths.get(key)
        if (
            held is None
            or not stats
            or len(stats) > len(held.rows)
            or stats[-1].id != held.leaf_id
            or stats[0].id != held.rows[len(held.rows) - len(stats)].id
        ):
            return None
        views = held.views
        if views is None:
            kept = _views.get(key)
            if kept is None:
                return None
            # Only the rows asked for: a recent window read after every turn must not look up
            # the whole path (1.5 ms at 10,000 rows) when older messages are not remembered.
            whole = len(stats) == len(held.rows)
            rows = held.rows if whole else held.rows[len(held.rows) - len(stats) :]
            found = list(map(kept.by_id.get, map(ROW_ID, rows)))
            if any(map(operator.is_, found, repeat(None))):
                return None
            _views.move_to_end(key)
            if not whole:  # kept in path order only for the whole path, which appends extend
                _paths.move_to_end(key)
                return cast(list[MessageView], found)
            views = held.views = cast(list[MessageView], found)
        _paths.move_to_end(key)
        return views[len(views) - len(stats) :]


def remember_views(store: ObjectStore, session_id: str, version: int, views: Iterable[MessageView]) -> None:
    """Remembers messages read as stored, unless the session changed since `version` was read."""
    memo = _object_memo(store)
    key = (memo, session_id)
    with _lock:
        if memo.version(session_id) != version:
            return
        held = _views.get(key)
        if held is None:
            held = _views[key] = _Views()
            memo.sessions.add(session_id)
        _add_views(key, held, views)


def _note_appended_views(key: tuple[_ObjectMemo, str], appended: Iterable[AppendedRow]) -> None:
    """Appends add messages and change none: the session's remembered messages stay valid."""
    held = _views.get(key)
    if held is not None:  # a row without a view is read from storage when it is first read
        _add_views(key, held, [row.view for row in appended if row.view is not None])
