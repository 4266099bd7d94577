"""Which objects this data directory handed to another server, kept across restarts.

A move ends by deleting the object at its source, which from then on must refuse the key (and
name its new owner) rather than create an empty object under it: until the proxy routes the key
to its new owner, a call that reaches the old one would otherwise be acknowledged into a second
copy, lost to the real one. A restart must not forget that, so each such delete is first written
here: `<data_dir>/MOVED`, one JSON line per change (`{"key": …, "to": …}` when an object leaves,
`{"key": …}` when it comes back), synced before the object's file is removed. The file is read
whole at startup and rewritten, compacted, once most of its lines are outdated.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from sessions_server.storage.datadir import sync_directory

MOVED_FILE_NAME = "MOVED"
log = logging.getLogger("sessions.storage")


class MovedObjects:
    """The journal of objects moved away: `where(key)` names the new owner ("" if not given)."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / MOVED_FILE_NAME
        self._lock = threading.Lock()  # writers run on worker threads
        self._moved: dict[str, str] = {}
        self._lines = 0
        self._load()

    def _load(self) -> None:
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            # A crash mid-append tore the last line (its delete was never acknowledged): cut it
            # off, or the next line appended would be glued to it.
            with self._path.open("r+b") as out:
                out.truncate(whole)
                os.fsync(out.fileno())
        for number, line in enumerate(data[:whole].decode("utf-8", "surrogatepass").splitlines(), 1):
            try:
                entry = json.loads(line)
                key, to = entry["key"], entry.get("to")
            except (ValueError, KeyError, TypeError):
                log.warning("%s: line %d is not a move record; skipped", self._path, number)
                continue
            if to is None:
                self._moved.pop(key, None)
            else:
                self._moved[key] = str(to)
            self._lines += 1

    def where(self, object_key: str) -> str | None:
        """Where the object went ("" when the mover did not say), or None if it was not moved."""
        return self._moved.get(object_key)

    def __contains__(self, object_key: str) -> bool:
        return object_key in self._moved

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._moved))  # a copy: recording or forgetting may follow in the loop

    def refuse(self, object_key: str, moved_to: str | None) -> None:
        """Notes in memory only (at once, on the caller's thread) where the object went, or with
        None that it did not: `record` makes it durable."""
        if moved_to is None:
            self._moved.pop(object_key, None)
        else:
            self._moved[object_key] = moved_to

    def record(self, object_key: str, moved_to: str) -> None:
        """Durably notes that the object left for `moved_to` (blocking: a worker thread)."""
        self._append({"key": object_key, "to": moved_to})
        self._moved[object_key] = moved_to

    def forget(self, object_key: str) -> None:
        """Durably notes that the object is here again (blocking: a worker thread)."""
        if object_key not in self._moved:
            return
        self._append({"key": object_key})
        del self._moved[object_key]

    def _append(self, entry: dict[str, str]) -> None:
        line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        with self._lock:
            if self._lines > 2 * len(self._moved) + 1000:
                self._rewrite()
            created = not self._path.exists()
            with self._path.open("ab") as out:
                out.write(line)
                out.flush()
                os.fsync(out.fileno())
            if created:
                sync_directory(self._path.parent)
            self._lines += 1

    def _rewrite(self) -> None:
        """Replaces the journal with one line per object still moved away (atomically)."""
        staged = self._path.with_name(MOVED_FILE_NAME + ".new")
        with staged.open("wb") as out:
            for key, to in self._moved.items():
                out.write(
                    (json.dumps({"key": key, "to": to}, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
                )
            out.flush()
            os.fsync(out.fileno())
        os.replace(staged, self._path)
        sync_directory(self._path.parent)
        self._lines = len(self._moved)
