"""A per-object memo of each session's most recently walked path (root to a leaf, as row stats).

Walking a path costs a point read per row, and an agent reads its whole history after nearly
every append. Appends never change an existing path: a new row only extends the path of its
parent. So the memo is extended by appends to its leaf and dropped by every other change to the
session (update, delete, clear, compaction, import). Readers get a copy; a walk that raced with a
change is not remembered (the session's version moved while it ran).

State lives in the store's `memo` and is touched from the event loop (hooks) and from reader
threads (lookups), under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sessions_server.storage import queries
from sessions_server.storage.rows import MAX_PATH_DEPTH, PathStat, PathStats, RowInfo
from sessions_server.storage.store import ObjectStore

MEMO_KEY = "paths"
# Paths of this many sessions are kept per open object (each at most 10,001 row stats).
MAX_SESSIONS = 4


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


@dataclass
class _Memo:
    lock: threading.Lock = field(default_factory=threading.Lock)
    versions: dict[str, int] = field(default_factory=dict)
    paths: dict[str, _Path] = field(default_factory=dict)  # by session, least recently stored first


def _memo(store: ObjectStore) -> _Memo:
    memo = store.memo.get(MEMO_KEY)
    if not isinstance(memo, _Memo):
        memo = store.memo.setdefault(MEMO_KEY, _Memo())
    return memo


def path_stats(store: ObjectStore, conn: Any, session_id: str, leaf_id: str) -> PathStats:
    """The session's path to `leaf_id`, from the memo when it holds that leaf (runs on a reader
    thread). The caller owns the returned rows."""
    memo = _memo(store)
    with memo.lock:
        held = memo.paths.get(session_id)
        if held is not None and held.leaf_id == leaf_id:
            return held.stats()
        version = memo.versions.get(session_id, 0)
    stats = queries.path_stats(conn, session_id, leaf_id)
    with memo.lock:
        if memo.versions.get(session_id, 0) == version:
            memo.paths.pop(session_id, None)
            memo.paths[session_id] = _Path(leaf_id, list(stats.rows), stats.walked, stats.oldest_id)
            while len(memo.paths) > MAX_SESSIONS:
                del memo.paths[next(iter(memo.paths))]
    return stats


def note_appends(store: ObjectStore, session_id: str, appended: Iterable[AppendedRow]) -> None:
    """Extends the remembered path by committed appends to its leaf (in commit order); an append
    elsewhere moves the active leaf away from it, which makes it useless: it is dropped."""
    memo = _memo(store)
    with memo.lock:
        held = memo.paths.get(session_id)
        if held is None:
            return
        for row in appended:
            if row.info.parent_id != held.leaf_id or row.bytes is None:
                del memo.paths[session_id]
                return
            if held.walked > MAX_PATH_DEPTH:
                # The walk is at its cap (MAX_PATH_DEPTH + 1 rows): the new row pushes the oldest
                # out. Which row becomes the oldest is known only if no walked row is hidden.
                if held.walked != len(held.rows):
                    del memo.paths[session_id]
                    return
                del held.rows[0]
                held.oldest_id = held.rows[0].id if held.rows else row.info.id
            else:
                held.walked += 1
            info = row.info
            held.rows.append(PathStat(info.id, info.role, row.bytes, info.token_estimate))
            held.leaf_id = info.id


def forget(store: ObjectStore, session_id: str) -> None:
    """The session changed in a way other than appends: its remembered path may be wrong."""
    memo = _memo(store)
    with memo.lock:
        memo.versions[session_id] = memo.versions.get(session_id, 0) + 1
        memo.paths.pop(session_id, None)
