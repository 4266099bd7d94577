"""An object's write-ahead log: how many frames it holds, and when the store checkpoints it.

Left to itself, SQLite checkpoints the WAL inside the commit that brings it to 1,000 frames, so
the write that crosses the mark waits for the checkpoint as well as its own commit: with 16 KiB
pages, every ~16 MB written (a 5 MB append took 170-200 ms instead of about 100 every third or
fourth time). The store instead runs the same PASSIVE checkpoint on the writer's connection
after it has answered the commit's writes; writes that arrive meanwhile queue and commit
together right after it. It still runs on the writer, so no commit lands while it copies and
the WAL starts over from its beginning at the next write, as with SQLite's own.

The store learns when it is due from the frame counts in the wal-index (the `-shm` file, whose
layout SQLite documents in "WAL-mode File Format", walformat.html): reading its first 100 bytes
costs one system call per commit. SQLite's own checkpoint stays armed, at a higher mark, should
these counts ever mislead.

A checkpoint copies the WAL's frames into the database but leaves the WAL file at its size: the
next writes reuse it from its beginning. So every object that once wrote CHECKPOINT_FRAMES
frames (about 300 appends of 1 KB at 16 KiB pages) kept a 16 MiB WAL for as long as it stayed
open, idle or not (8 such objects: 125 MiB of WAL beside 7.8 MiB of data). The registry sweeps
its open objects every TRIM_SWEEP_SECONDS, and one that has not committed since the last sweep
and whose WAL file holds TRIM_MIN_BYTES or more has it emptied by a TRUNCATE checkpoint, once
per quiet spell (`QuietTrim`).

A smaller WAL stays, but a quiet object's frames not yet in the database are copied there by a
PASSIVE checkpoint in the same sweep: left to the 1,000-frame mark or the close, a small object
open for days kept every write in its WAL, and its database file stayed the empty file it was
created as (a copy of the file alone, or a WAL lost to the disk, held nothing of it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

CHECKPOINT_FRAMES = 1000
"""Frames added since the last checkpoint that make the next one due (SQLite's own default)."""

BACKSTOP_FRAMES = 4 * CHECKPOINT_FRAMES
"""The writer connection's `wal_autocheckpoint` while the store checkpoints by itself."""

TRIM_SWEEP_SECONDS = 30.0
"""How often the registry looks for quiet objects whose WAL file to empty."""

TRIM_MIN_BYTES = 1024 * 1024
"""A smaller WAL file is left as it is: an object written now and then would otherwise pay for
recreating its WAL after every pause (a TRUNCATE checkpoint's two syncs, then the file grown
again), to give back less than a megabyte."""

# Offsets in the wal-index: the first copy of the header's szPage (the page size; 1 for 65,536),
# mxFrame (frames in the WAL) and nPage (the database's size in pages as of the last commit), and
# the checkpoint information's nBackfill (frames already copied into the database). Native byte
# order.
_SZ_PAGE = 14
_MX_FRAME = 16
_N_PAGE = 20
_BACKFILL = 96


class WalIndex:
    """Read-only view of one object's wal-index; `open` returns None where there is none (an
    exclusive-locking connection keeps it in private memory)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd  # None once closed: the number may name another file by then

    @classmethod
    def open(cls, database: Path) -> WalIndex | None:
        try:
            return cls(os.open(f"{database}-shm", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            return None

    def frames(self) -> tuple[int, int]:
        """(frames in the WAL, frames of them already checkpointed). Never raises: it runs right
        after a commit, which must not be reported as failed; (0, 0) leaves the checkpoint to
        SQLite's backstop."""
        head = self._head(_BACKFILL + 4)
        if head is None:
            return 0, 0
        return _field(head, _MX_FRAME, 4), _field(head, _BACKFILL, 4)

    def holds_uncopied_frames(self) -> bool:
        """Whether the WAL holds frames a checkpoint has not copied into the database."""
        frames, copied = self.frames()
        return frames > copied

    def database_bytes(self) -> int | None:
        """The database's size as of its last commit, wherever its pages are (the file, the
        WAL); None before the wal-index is initialized."""
        head = self._head(_N_PAGE + 4)
        if head is None:
            return None
        page_size = _field(head, _SZ_PAGE, 2)
        return _field(head, _N_PAGE, 4) * (65536 if page_size == 1 else page_size)

    def _head(self, length: int) -> bytes | None:
        """The wal-index's first `length` bytes; None once closed, on a read error, or before
        SQLite initialized them (nothing written since the WAL was created)."""
        if self._fd is None:
            return None
        try:
            head = os.pread(self._fd, length, 0)
        except OSError:
            return None
        return head if len(head) == length else None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _field(head: bytes, offset: int, size: int) -> int:
    return int.from_bytes(head[offset : offset + size], sys.byteorder)


class CheckpointPolicy:
    """Whether a checkpoint is due, from the frame counts seen after each commit.

    A checkpoint is due once CHECKPOINT_FRAMES frames were added since the last one. A reader
    that holds an old snapshot (a replicator, a long export) keeps a checkpoint from copying
    the newest frames; counting from where the last checkpoint left the WAL, not from what it
    copied, keeps the store from checkpointing again after every commit while that lasts."""

    def __init__(self) -> None:
        self.due = False
        self._frames_at_last = 0  # frames in the WAL when the last checkpoint finished

    def after_commit(self, frames: int) -> None:
        if frames < self._frames_at_last:
            self._frames_at_last = 0  # the WAL started over
        self.due = frames - self._frames_at_last >= CHECKPOINT_FRAMES

    def after_checkpoint(self, frames: int) -> None:
        self._frames_at_last = frames
        self.due = False


TRUNCATE: Final = "truncate"
"""`QuietTrim.due`: empty the WAL file."""
COPY: Final = "copy"
"""`QuietTrim.due`: copy its frames into the database, leaving the file (a PASSIVE checkpoint)."""


class QuietTrim:
    """Whether a quiet object's WAL file is due to be emptied, or its frames copied into the
    database, from what each sweep sees.

    Quiet: no commit since the previous sweep, so between one and two sweeps without a write.
    One try per quiet spell: a reader that holds a snapshot then (a replicator such as
    Litestream always does; a long export) makes the TRUNCATE give up at once, and trying again
    every sweep would only repeat that."""

    def __init__(self) -> None:
        self._commits_seen = -1
        self._tried_at = -1  # the commit count of the spell last tried (or found too small)

    def due(self, commits: int, wal_bytes: Callable[[], int], uncopied: Callable[[], bool]) -> str | None:
        """TRUNCATE, COPY or None. `commits`: the store's commit count now; `wal_bytes` measures
        the WAL file; `uncopied` says whether it holds frames not yet in the database."""
        if commits != self._commits_seen:
            self._commits_seen = commits
            return None
        if self._tried_at == commits:
            return None
        self._tried_at = commits
        if wal_bytes() >= TRIM_MIN_BYTES:
            return TRUNCATE
        return COPY if uncopied() else None
