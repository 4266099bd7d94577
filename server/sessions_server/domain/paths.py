"""A memo of recently walked session paths (root to a leaf, as row stats), per open object.

Walking a path costs a point read per row, and an agent reads its whole history after nearly
every append. Appends never change an existing path: a new row only extends the path of its
parent. So a remembered path is extended by appends to its leaf and dropped by every other
change to the session (update, delete, clear, compaction, import). Readers get a copy; a walk
that raced with a change is not remembered (the session's version moved while it ran).

Memory is bounded for the whole process: at most MAX_REMEMBERED_ROWS row stats in all, least
recently used paths dropped first. Hooks run on the event loop and lookups on reader threads,
all under one lock (each holds it for a dictionary operation or a list copy).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sessions_server.storage import queries
from sessions_server.storage.rows import MAX_PATH_DEPTH, PathStat, PathStats, RowInfo
from sessions_server.storage.store import ObjectStore

MEMO_KEY = "paths"
# About 200 bytes each: some 50 MB at most, for 25 sessions at the 10,001-row depth cap.
MAX_REMEMBERED_ROWS = 250_000


@dataclass(frozen=True, slots=True)
class AppendedRow:
    """A committed append as the memo needs it: `bytes` is None when it references attachments
    (their payloads count too, and are not known here)."""

    info: RowInfo
    bytes: int | None


@dataclass(slots=True)
class _Path:
    leaf_id: str
    rows: list[PathStat]
    walked: int
    oldest_id: str | None

    def stats(self) -> PathStats:
        return PathStats(list(self.rows), self.walked, self.oldest_id)


@dataclass(eq=False)
class _ObjectMemo:
    """One open object's part: the key of its paths (by identity) and its sessions' versions."""

    versions: dict[str, int] = field(default_factory=dict)


_lock = threading.Lock()
_paths: OrderedDict[tuple[_ObjectMemo, str], _Path] = OrderedDict()  # least recently used first
_rows = 0


def _object_memo(store: ObjectStore) -> _ObjectMemo:
    memo = store.memo.get(MEMO_KEY)
    if not isinstance(memo, _ObjectMemo):
        memo = store.memo.setdefault(MEMO_KEY, _ObjectMemo())
    return memo


def _drop(key: tuple[_ObjectMemo, str]) -> None:
    global _rows
    held = _paths.pop(key, None)
    if held is not None:
        _rows -= len(held.rows)


def _keep(key: tuple[_ObjectMemo, str], path: _Path) -> None:
    global _rows
    _drop(key)
    _paths[key] = path
    _rows += len(path.rows)
    while _rows > MAX_REMEMBERED_ROWS and _paths:
        _drop(next(iter(_paths)))


def path_stats(store: ObjectStore, conn: Any, session_id: str, leaf_id: str) -> PathStats:
    """The session's path to `leaf_id`, from the memo when it holds that leaf (runs on a reader
    thread). The caller owns the returned rows."""
    memo = _object_memo(store)
    key = (memo, session_id)
    with _lock:
        held = _paths.get(key)
        if held is not None and held.leaf_id == leaf_id:
            _paths.move_to_end(key)
            return held.stats()
        version = memo.versions.get(session_id, 0)
    stats = queries.path_stats(conn, session_id, leaf_id)
    with _lock:
        if memo.versions.get(session_id, 0) == version:
            _keep(key, _Path(leaf_id, list(stats.rows), stats.walked, stats.oldest_id))
    return stats


def note_appends(store: ObjectStore, session_id: str, appended: Iterable[AppendedRow]) -> None:
    """Extends the remembered path by committed appends to its leaf (in commit order); an append
    elsewhere moves the active leaf away from it, which makes it useless: it is dropped."""
    global _rows
    key = (_object_memo(store), session_id)
    with _lock:
        held = _paths.get(key)
        if held is None:
            return
        for row in appended:
            if row.info.parent_id != held.leaf_id or row.bytes is None:
                _drop(key)
                return
            if held.walked > MAX_PATH_DEPTH:
                # The walk is at its cap (MAX_PATH_DEPTH + 1 rows): the new row pushes the oldest
                # out. Which row becomes the oldest is known only if no walked row is hidden.
                if held.walked != len(held.rows):
                    _drop(key)
                    return
                del held.rows[0]
                _rows -= 1
                held.oldest_id = held.rows[0].id if held.rows else row.info.id
            else:
                held.walked += 1
            info = row.info
            held.rows.append(PathStat(info.id, info.role, row.bytes, info.token_estimate))
            _rows += 1
            held.leaf_id = info.id
        _keep(key, held)


def forget(store: ObjectStore, session_id: str) -> None:
    """The session changed in a way other than appends: its remembered path may be wrong."""
    memo = _object_memo(store)
    with _lock:
        memo.versions[session_id] = memo.versions.get(session_id, 0) + 1
        _drop((memo, session_id))
