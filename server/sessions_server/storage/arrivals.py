"""Objects this data directory holds for the end of a move, kept across restarts.

A move's destination installs the copy it received and holds it (reads only) until the mover,
having deleted the source, releases it, or drops it when the move fails (ImportObject's
`hold_for_move`). Held in memory only, a restart of the destination mid-move let the copy take
writes while the source still did: two copies diverging. So each hold is written here first,
`<data_dir>/ARRIVING`, a JSON object of the holds in place (few: one per move under way),
replaced whole and synced at each change. A hold outlives restarts and has no lease: a mover
that never comes back leaves the copy read-only until an operator releases it (the source gone:
the move happened) or drops it (the source still there).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import orjson

from sessions_server.storage.datadir import sync_directory

ARRIVING_FILE_NAME = "ARRIVING"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One held copy: the hold's id (the import's `move_id`), and where the key was recorded
    as moved to before the import (None if it was not), to be refused so again if it is dropped."""

    hold: str
    moved_before: str | None


class Arrivals:
    """The holds of this data directory, read at startup; changed on worker threads."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / ARRIVING_FILE_NAME
        self._lock = threading.Lock()
        self._held: dict[str, Arrival] = {}
        try:
            data = orjson.loads(self._path.read_bytes())
        except FileNotFoundError:
            return
        for key, entry in data.items():
            self._held[key] = Arrival(str(entry["hold"]), entry.get("before"))

    def held(self) -> dict[str, Arrival]:
        with self._lock:
            return dict(self._held)

    def hold(self, object_key: str, arrival: Arrival) -> None:
        """Durably notes the hold (blocking: a worker thread)."""
        with self._lock:
            self._held[object_key] = arrival
            self._write()

    def end(self, object_key: str) -> None:
        """Durably notes the hold released or dropped (blocking: a worker thread)."""
        with self._lock:
            if self._held.pop(object_key, None) is not None:
                self._write()

    def _write(self) -> None:
        staged = self._path.with_name(ARRIVING_FILE_NAME + ".new")
        entries = {key: {"hold": a.hold, "before": a.moved_before} for key, a in self._held.items()}
        with staged.open("wb") as out:
            out.write(orjson.dumps(entries))
            out.flush()
            os.fsync(out.fileno())
        os.replace(staged, self._path)
        sync_directory(self._path.parent)
