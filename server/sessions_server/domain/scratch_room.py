"""Room on the data directory's disk for the copies the server makes in scratch: exports'
snapshots, received object files, and the staged copy each received file is installed from.

A copy that took the disk's last bytes failed every object's writes (`STORAGE_FULL`) until it
failed itself and was removed. So each is let in only while the disk keeps FREE_MARGIN_BYTES
free besides what the copies under way will still take: what each reserves, counted until it
is written (then the disk's own free space shows it). Reading the free space and the
reservations is not atomic with other processes' writes: this bounds the server's own copies,
not everything that fills the disk.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from sessions_server.storage import files

FREE_MARGIN_BYTES = 16 * 1024 * 1024


class ScratchRoom:
    """The room check and the reservations of one data directory's copies."""

    def __init__(self, scratch_dir: Path) -> None:
        self._scratch_dir = scratch_dir
        self.reserved = 0  # bytes that copies under way will still write

    def check(self, adding: int, what: str) -> None:
        """Raises OSError ENOSPC unless `adding` more bytes leave FREE_MARGIN_BYTES free beside
        the reservations. Safe from any thread (it reads a count the event loop keeps)."""
        free = files.free_bytes(self._scratch_dir)
        reserved = self.reserved
        if adding + reserved + FREE_MARGIN_BYTES > free:
            held = f", {reserved} of them reserved by copies under way" if reserved else ""
            raise OSError(
                errno.ENOSPC,
                f"{what} needs {adding} bytes and the disk has {free} free{held}; "
                f"a copy leaves {FREE_MARGIN_BYTES} free at least",
            )

    def reserve(self, size: int, what: str) -> None:
        """`check`, then holds `size` bytes until `release` (on the event loop's thread)."""
        self.check(size, what)
        self.reserved += size

    def release(self, size: int) -> None:
        self.reserved -= size

    @contextlib.contextmanager
    def reserved_for(self, size: int, what: str) -> Iterator[None]:
        self.reserve(size, what)
        try:
            yield
        finally:
            self.release(size)
