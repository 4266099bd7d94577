"""The data directory as a whole: one owner at a time, and directory entries that survive a
power cut.

An object's file is owned by one server at a time, which keeps what it knows of the file in
memory (each session's tail, remembered paths, the search index's presence). A second server, or
an `import-store`, writing the same files underneath it would make those memories wrong: an
append placed under a stale tail, a file replaced under an open connection whose later writes go
to the unlinked copy. So whoever writes a data directory first takes its lock: an exclusive
`flock` on `<data_dir>/LOCK`, held while it runs and dropped by the kernel when the process ends,
however it ends. A second taker is refused at once, told who holds it.

A directory entry (a new file's name, a new subdirectory's) is durable only once the directory
holding it is synced. SQLite syncs the directory of the journal and WAL files it creates, which
is also where an object's file is; the directories above it that the server creates are synced
here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE_NAME = "LOCK"
SCRATCH_DIR_NAME = "scratch"
"""Where moves stage whole-file copies (an export's snapshot, an import as it arrives)."""
SET_ASIDE_DIR_NAME = "set-aside"
"""Where a start moves the files of objects recorded as moved away (kept for the operator)."""


class DataDirectoryInUse(OSError):
    """Another process (or another server in this one) holds the data directory's lock."""


class DataDirectoryLock:
    """The exclusive lock on a data directory; `release` it (or end the process) to hand it on."""

    def __init__(self, data_dir: Path, fd: int) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path, holder: str) -> DataDirectoryLock:
        """Creates the directory if needed and takes its lock, recording `holder` (with this
        process's id) in the lock file for whoever is refused next. Raises DataDirectoryInUse,
        naming the holder, when it is taken; other OSErrors as the disk reports them."""
        make_directories(data_dir)
        fd = os.open(data_dir / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            current = _recorded_holder(fd)
            os.close(fd)
            raise DataDirectoryInUse(f"data directory {data_dir} is in use by {current or 'another process'}") from None
        except BaseException:
            os.close(fd)
            raise
        # The file is never removed: unlinking it would let a later taker lock a new file while
        # an earlier one still holds the old.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({holder})\n".encode(), 0)
        return cls(data_dir, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drops the lock (closing the file releases it); a second call does nothing."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _recorded_holder(fd: int) -> str:
    """What the holder wrote in the lock file (empty while it is still writing it)."""
    with contextlib.suppress(OSError):
        return os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    return ""


def clear_scratch(data_dir: Path) -> tuple[int, int]:
    """Removes what the scratch directory holds, returning (files, bytes). Only its owner may:
    at startup, under the lock, nothing in it is in use, and what is there a crash left behind
    (a snapshot or an import cut short can be as large as an object)."""
    files = size = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(data_dir / SCRATCH_DIR_NAME) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                size += entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
                files += 1
    return files, size


def make_directories(directory: Path) -> None:
    """`directory.mkdir(parents=True, exist_ok=True)`, with every directory it creates made
    durable: the parent of each is synced, deepest first, so no acknowledged write can lose
    the path to its file in a power cut. Costs one `stat` when the directory exists."""
    if directory.is_dir():
        return
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    directory.mkdir(parents=True, exist_ok=True)
    for created in missing:  # deepest first: each parent holds the entry just created
        sync_directory(created.parent)


def sync_directories(directory: Path, top: Path) -> None:
    """Syncs `directory` and its ancestors up to `top`: an entry made or removed in a directory
    survives a power cut only once the directory itself is synced."""
    for current in (directory, *directory.parents):
        sync_directory(current)
        if current == top or top not in current.parents:
            return


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
