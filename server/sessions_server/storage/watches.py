"""Watches over what commits change in a session other than by appending: the ids of the
messages updated or deleted, or everything (a clear, a compaction record, the file replaced).

A compaction plans, asks a model for seconds or minutes, then stores its record; the record is
refused only if a change since the plan touched what it depends on, not for a reply streaming
into the newest message meanwhile. A watch is noted as each batch commits, on the writer's
thread: begun before a read's snapshot, it sees every change that snapshot lacks. Once the plan
names what it depends on, the watch keeps only those ids (`narrow`).

The registry keeps an object's watches while any is under way and hands them to each feed hub
of the object, whose store notes its commits there: they last through a close to make room for
other objects (a reopened object is the same file, nothing of it changed), and the registry tells
them when the file is replaced or removed.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping

# A watch not yet narrowed that notes more ids than this keeps "everything" instead (a delete of
# many messages while a plan reads).
MAX_WATCHED_IDS = 10_000

Changed = frozenset[str] | None
"""What one job changed in a session: the ids it updated or deleted, None for everything."""


class ChangeWatch:
    """The changes committed to one session since the watch began (or `restart`ed)."""

    __slots__ = ("_ids", "_interest", "_owner", "session_id")

    def __init__(self, owner: ChangeWatches, session_id: str) -> None:
        self._owner = owner
        self.session_id = session_id
        self._ids: set[str] | None = set()  # None: everything
        self._interest: frozenset[str] | None = None  # None: every id

    def restart(self) -> None:
        """Forgets what was noted, and any narrowing: the watch begins again now."""
        with self._owner.lock:
            self._ids = set()
            self._interest = None

    def narrow(self, ids: frozenset[str]) -> None:
        """From now on keeps only changes of `ids` (what was noted of others is let go)."""
        with self._owner.lock:
            self._interest = ids
            if self._ids is not None:
                self._ids.intersection_update(ids)

    def touches(self, ids: Collection[str]) -> bool:
        """Whether a change noted since the watch began may have touched any of `ids`."""
        with self._owner.lock:
            return self._ids is None or not self._ids.isdisjoint(ids)

    def stop(self) -> None:
        self._owner.remove(self)

    def _note(self, changed: Changed) -> None:  # under the owner's lock
        if self._ids is None:
            return
        if changed is not None and self._interest is not None:
            changed = changed & self._interest
        if changed is None or len(self._ids) + len(changed) > MAX_WATCHED_IDS:
            self._ids = None
        else:
            self._ids.update(changed)


class ChangeWatches:
    """The watches of one object, by session. Noted from the writer's thread, begun and ended
    on the event loop's: a lock keeps them apart."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._by_session: dict[str, list[ChangeWatch]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_session)

    def start(self, session_id: str) -> ChangeWatch:
        watch = ChangeWatch(self, session_id)
        with self.lock:
            self._by_session.setdefault(session_id, []).append(watch)
        return watch

    def remove(self, watch: ChangeWatch) -> None:
        with self.lock:
            watching = self._by_session.get(watch.session_id, [])
            if watch in watching:
                watching.remove(watch)
            if not watching:
                self._by_session.pop(watch.session_id, None)

    def note(self, changes: Mapping[str, Changed]) -> None:
        """A commit changed these sessions (called after it, before the next batch begins)."""
        if not self._by_session:  # nobody is watching: no lock taken for the common commit
            return
        with self.lock:
            for session_id, changed in changes.items():
                for watch in self._by_session.get(session_id, ()):
                    watch._note(changed)

    def note_everything(self) -> None:
        """The object's file is being replaced or removed: every watch sees everything changed."""
        with self.lock:
            for watching in self._by_session.values():
                for watch in watching:
                    watch._note(None)
