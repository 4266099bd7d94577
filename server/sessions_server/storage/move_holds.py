"""The holds a move puts on an object at either end, kept across restarts.

A move's destination installs the copy it received and holds it (reads only) until the mover,
having deleted the source, releases it, or drops it when the move fails (ImportObject's
`hold_for_move`). Held in memory only, a restart of the destination mid-move let the copy take
writes while the source still did: two copies diverging. So each such hold is written to
`<data_dir>/ARRIVING` first. It has no lease: a mover that never comes back leaves the copy
read-only until an operator releases it (the source gone: the move happened) or drops it (the
source still there).

A move's source refuses writes from its locked export's last frame until the move's delete, under
the lock's lease. Held in memory only, a source restarted in between took writes again, and the
move had to give up at its delete (the copy sent lacked them). So the lock is written to
`<data_dir>/DEPARTING` before that last frame goes, with the wall-clock time its lease ends: a
restart keeps it for what is left of the lease, and the move's delete still finds it.

Each file is a JSON object of the holds in place (few: one per move under way), replaced whole
and synced at each change.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sessions_server.storage.datadir import sync_directory

ARRIVING_FILE_NAME = "ARRIVING"
DEPARTING_FILE_NAME = "DEPARTING"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One held copy: the hold's id (the import's `move_id`), where the key was recorded as
    moved to before the import (None if it was not) and the move lock that move's delete ended,
    to be refused so again if it is dropped, and the name of the copy kept of the object it
    replaced (None if none), to be put back then."""

    hold: str
    moved_before: str | None
    kept: str | None = None
    moved_before_lock: str = ""


@dataclass(frozen=True, slots=True)
class Departure:
    """One locked source: the lock's id (the export's `move_id`), when its lease ends, in
    seconds since the epoch (a restart's monotonic clock starts over), and how long it had left
    when it was written (`left`; None in files written before it was kept), which bounds it
    whatever the clock did across the restart."""

    lock: str
    until: float
    left: float | None = None


class _HoldFile:
    """A JSON object of key → entry, read at startup; changed on worker threads."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return
        self._entries = {str(key): dict(entry) for key, entry in data.items()}

    def entries(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._entries)

    def put(self, object_key: str, entry: dict[str, Any]) -> None:
        """Durably notes the entry (blocking: a worker thread)."""
        with self._lock:
            self._write({**self._entries, object_key: entry})

    def drop(self, object_key: str, only_if: str = "", field: str = "") -> None:
        """Durably notes the key's entry gone; with `only_if`, only while its `field` is that
        (a newer hold on the key stays). Blocking: a worker thread."""
        with self._lock:
            entry = self._entries.get(object_key)
            if entry is None or (only_if and entry.get(field) != only_if):
                return
            self._write({key: kept for key, kept in self._entries.items() if key != object_key})

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        """Replaces the file with `entries`, then holds them once durable: a write that fails
        leaves them as they were in memory (kept there, a failed hold's entry went to disk with
        the next change of another key, and a restart found a lock on an object never moved)."""
        staged = self._path.with_name(self._path.name + ".new")
        with staged.open("wb") as out:
            out.write(orjson.dumps(entries))
            out.flush()
            os.fsync(out.fileno())
        os.replace(staged, self._path)
        sync_directory(self._path.parent)
        self._entries = entries


class Arrivals:
    """The copies this data directory holds for the end of a move (`ARRIVING`)."""

    def __init__(self, data_dir: Path) -> None:
        self._file = _HoldFile(data_dir / ARRIVING_FILE_NAME)

    def held(self) -> dict[str, Arrival]:
        return {
            key: Arrival(str(e["hold"]), e.get("before"), e.get("kept"), str(e.get("before_lock") or ""))
            for key, e in self._file.entries().items()
        }

    def hold(self, object_key: str, arrival: Arrival) -> None:
        """Durably notes the hold (blocking: a worker thread)."""
        entry = {"hold": arrival.hold, "before": arrival.moved_before, "kept": arrival.kept}
        self._file.put(object_key, {**entry, "before_lock": arrival.moved_before_lock})

    def end(self, object_key: str) -> None:
        """Durably notes the hold released or dropped (blocking: a worker thread)."""
        self._file.drop(object_key)


class Departures:
    """The objects this data directory holds locked for a move away (`DEPARTING`)."""

    def __init__(self, data_dir: Path) -> None:
        self._file = _HoldFile(data_dir / DEPARTING_FILE_NAME)

    def held(self) -> dict[str, Departure]:
        return {
            key: Departure(str(e["lock"]), float(e["until"]), None if e.get("left") is None else float(e["left"]))
            for key, e in self._file.entries().items()
        }

    def hold(self, object_key: str, departure: Departure) -> None:
        """Durably notes the lock (blocking: a worker thread)."""
        self._file.put(object_key, {"lock": departure.lock, "until": departure.until, "left": departure.left})

    def end(self, object_key: str, lock: str) -> None:
        """Durably notes the lock released or its move done, unless another has replaced it
        (blocking: a worker thread)."""
        self._file.drop(object_key, only_if=lock, field="lock")
