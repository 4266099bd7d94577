"""Which objects this data directory handed to another server, kept across restarts.

A move ends by deleting the object at its source, which from then on must refuse the key (and
name its new owner) rather than create an empty object under it: until the proxy routes the key
to its new owner, a call that reaches the old one would otherwise be acknowledged into a second
copy, lost to the real one. A restart must not forget that, so each such delete is first written
here: `<data_dir>/MOVED`, one JSON line per change (`{"key": …, "to": …, "move": …}` when an
object leaves, `"move"` naming the move lock its delete ended if it named one; `{"key": …}`
when it comes back), synced before the object's file is removed. Once the files
are gone the record is written again with `"gone": true` (not synced: a lost one only costs a
look at the next start), so that a start looks for leftover files only where a delete may have
been cut short, not under every key ever moved away (a stat each: 10 s at a million). The file
is read whole at startup and rewritten, compacted, once most of its lines are outdated.

What the journal holds (`_recorded`) is kept apart from what the server refuses (`_moved`): a
refusal is noted in memory before its record is written, and a compaction must not make durable
a record whose append then fails (the delete is answered "nothing was deleted"). An append that
fails part-way is cut back off the file, so that the next one does not start inside it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from sessions_server.storage.datadir import sync_directory

MOVED_FILE_NAME = "MOVED"
REWRITE_SLACK_LINES = 1000
log = logging.getLogger("sessions.storage")


class MovedObjects:
    """The journal of objects moved away: `where(key)` names the new owner ("" if not given)."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / MOVED_FILE_NAME
        self._lock = threading.Lock()  # writers run on worker threads
        self._moved: dict[str, str] = {}  # refused here: recorded, or being recorded
        self._recorded: dict[str, str] = {}  # what the journal says (changed under the lock)
        self._move_ids: dict[str, str] = {}  # the move lock each recorded delete ended, if named
        self._torn = False  # a failed append could not be cut off: rewrite before the next
        # Moved away, its files perhaps still here: recorded, and not yet noted gone.
        self._unsettled: set[str] = set()
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
        for number, line in enumerate(data[:whole].splitlines(), 1):
            try:
                entry = _parse(line)
                key, to = entry["key"], entry.get("to")
            except (ValueError, KeyError, TypeError):
                log.warning("%s: line %d is not a move record; skipped", self._path, number)
                continue
            if to is None:
                self._moved.pop(key, None)
                self._recorded.pop(key, None)
                self._move_ids.pop(key, None)
                self._unsettled.discard(key)
            else:
                self._moved[key] = self._recorded[key] = str(to)
                self._move_ids[key] = str(entry.get("move") or "")
                if entry.get("gone") is True:
                    self._unsettled.discard(key)
                else:
                    self._unsettled.add(key)
            self._lines += 1

    def where(self, object_key: str) -> str | None:
        """Where the object went ("" when the mover did not say), or None if it was not moved."""
        return self._moved.get(object_key)

    def is_recorded(self, object_key: str) -> bool:
        """Whether the journal holds the object's move (not only a refusal noted in memory)."""
        return object_key in self._recorded

    def move_id(self, object_key: str) -> str:
        """The move lock the object's recorded delete ended ("" when it named none, or when the
        record was written by a version that did not keep it)."""
        return self._move_ids.get(object_key, "")

    def __contains__(self, object_key: str) -> bool:
        return object_key in self._moved

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._moved))  # a copy: recording or forgetting may follow in the loop

    def unsettled(self) -> list[str]:
        """The objects moved away whose files may still be here (a delete cut short)."""
        return sorted(self._unsettled)

    def refuse(self, object_key: str, moved_to: str | None) -> None:
        """Notes in memory only (at once, on the caller's thread) where the object went, or with
        None that it did not: `record` makes it durable."""
        if moved_to is None:
            self._moved.pop(object_key, None)
        else:
            self._moved[object_key] = moved_to

    def record(self, object_key: str, moved_to: str, move_id: str = "") -> None:
        """Durably notes that the object left for `moved_to`, its delete ending the move lock
        `move_id` (blocking: a worker thread)."""
        with self._lock:
            self._append([_record(object_key, moved_to, move_id)])
            self._moved[object_key] = self._recorded[object_key] = moved_to
            self._move_ids[object_key] = move_id
            self._unsettled.add(object_key)

    def settle(self, object_keys: Iterable[str]) -> None:
        """Notes that these moved objects' files are gone (blocking: a worker thread). Not
        synced: if a crash loses it, the next start looks for the files once more."""
        # Under the lock from the check to the line: a `forget` between them (the object
        # imported back) would be followed by a line recording it as moved away again.
        with self._lock:
            keys = [key for key in object_keys if key in self._unsettled and key in self._recorded]
            self._unsettled.difference_update(keys)
            if len(keys) > REWRITE_SLACK_LINES:  # the first start of a new version: all of them
                self._rewrite()
                return
            # The record again, flagged: a server of an older version reads it as the record.
            self._append(
                [{**_record(key, self._recorded[key], self._move_ids.get(key, "")), "gone": True} for key in keys],
                sync=False,
            )

    def forget(self, object_key: str) -> None:
        """Durably notes that the object is here again (blocking: a worker thread)."""
        with self._lock:
            if object_key not in self._recorded and object_key not in self._moved:
                return
            self._append([{"key": object_key}])
            self._moved.pop(object_key, None)
            self._recorded.pop(object_key, None)
            self._move_ids.pop(object_key, None)
            self._unsettled.discard(object_key)

    def _append(self, entries: list[dict[str, Any]], *, sync: bool = True) -> None:
        """Appends to the journal (the caller holds the lock)."""
        if not entries:
            return
        lines = b"".join(_line(entry) for entry in entries)
        if self._torn or self._lines > 2 * len(self._recorded) + REWRITE_SLACK_LINES:
            self._rewrite()
        created = not self._path.exists()
        with self._path.open("ab", buffering=0) as out:  # unbuffered: no bytes left to flush at close
            end = out.seek(0, os.SEEK_END)
            try:
                written = memoryview(lines)
                while written:
                    written = written[out.write(written) or 0 :]
                if sync:
                    os.fsync(out.fileno())
            except OSError:
                self._torn = not _cut_back(out.fileno(), end)
                raise
        if created:
            sync_directory(self._path.parent)
        self._lines += len(entries)

    def _rewrite(self) -> None:
        """Replaces the journal with one line per object still moved away (atomically)."""
        staged = self._path.with_name(MOVED_FILE_NAME + ".new")
        with staged.open("wb") as out:
            for key, to in self._recorded.items():  # not the refusals: some are not recorded yet
                entry = _record(key, to, self._move_ids.get(key, ""))
                if key not in self._unsettled:
                    entry["gone"] = True
                out.write(_line(entry))
            out.flush()
            os.fsync(out.fileno())
        os.replace(staged, self._path)
        sync_directory(self._path.parent)
        self._lines = len(self._recorded)
        self._torn = False


def _record(object_key: str, moved_to: str, move_id: str) -> dict[str, Any]:
    entry = {"key": object_key, "to": moved_to}
    if move_id:
        entry["move"] = move_id
    return entry


def _cut_back(fd: int, size: int) -> bool:
    """Cuts what a failed append left off the file's end; False if that failed too."""
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError as exc:
        log.warning("the move journal could not be cut back after a failed append (%s); it is rewritten next", exc)
        return False
    return True


def _line(entry: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # a lone surrogate, which orjson refuses
        return (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")


def _parse(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:  # a lone surrogate, which orjson refuses and `_line` writes
        return json.loads(line.decode("utf-8", "surrogatepass"))
