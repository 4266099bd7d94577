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
HELD_DIR_NAME = "held"
"""Where a move's import keeps a copy of the object it replaced, until its hold ends: the copy
is put back if the move fails."""


class DataDirectoryInUse(OSError):
    """Another process (or another server in this one) holds the data directory's lock."""


class DataDirectoryNotWritable(OSError):
    """The data directory, or a directory in it, cannot be created or written; the message
    names the path at fault and the system's reason."""


# Tries at taking the lock file, each after finding it gone under a holder that gave up.
LOCK_ATTEMPTS = 100


class DataDirectoryLock:
    """The exclusive lock on a data directory; `release` it (or end the process) to hand it on,
    or `abandon` it to remove what its holder made there first."""

    def __init__(self, data_dir: Path, fd: int, created: list[Path]) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd
        # What this holder made, oldest first: directories (the data directory and any parent
        # of it that was missing, deepest first) and the lock file.
        self._created = created

    @classmethod
    def acquire(cls, data_dir: Path, holder: str) -> DataDirectoryLock:
        """Creates the directory if needed and takes its lock, recording `holder` (with this
        process's id) in the lock file for whoever is refused next. Raises DataDirectoryInUse,
        naming the holder, when it is taken; DataDirectoryNotWritable when the directory or its
        lock file cannot be made; other OSErrors as the disk reports them."""
        lock_path = data_dir / LOCK_FILE_NAME
        created: list[Path] = []
        for _ in range(LOCK_ATTEMPTS):
            try:
                created += make_directories(data_dir)
            except OSError as exc:
                where = exc.filename or data_dir
                raise DataDirectoryNotWritable(f"cannot create {where} ({exc.strerror or exc})") from None
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                made_lock = True
            except FileNotFoundError:  # the directory went meanwhile (a holder that gave up): again
                continue
            except FileExistsError:
                made_lock = False
                try:
                    fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:  # removed meanwhile by a holder that gave up: again
                    continue
                except OSError as exc:
                    raise DataDirectoryNotWritable(
                        f"{data_dir} is not writable: cannot open {lock_path} ({exc.strerror or exc})"
                    ) from None
            except OSError as exc:
                raise DataDirectoryNotWritable(
                    f"{data_dir} is not writable: cannot create {lock_path} ({exc.strerror or exc})"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                current = _recorded_holder(fd)
                os.close(fd)
                raise DataDirectoryInUse(
                    f"data directory {data_dir} is in use by {current or 'another process'}"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            if _still_named(fd, lock_path):
                break
            # A holder that gave up (`abandon`) removed the file after this opened it: the lock
            # taken is on a file nobody else will open. Take the one the name leads to now.
            os.close(fd)
        else:  # the name kept leading nowhere (a dangling symlink, say)
            raise DataDirectoryNotWritable(f"{data_dir} is not usable: {lock_path} cannot be opened as a lock file")
        if made_lock:
            created.append(lock_path)
        # The file is removed only by `abandon`, under the lock, and takers check that the file
        # they locked still has the name (above): unlinking it otherwise would let a later taker
        # lock a new file while an earlier one still holds the old.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({holder})\n".encode(), 0)
        return cls(data_dir, fd, created)

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def created_data_dir(self) -> bool:
        """Whether taking the lock made the data directory itself (it did not exist before)."""
        return self.data_dir in self._created

    def note_created(self, paths: list[Path]) -> None:
        """Records directories the holder made in the data directory, for `abandon`."""
        self._created += paths

    def release(self) -> None:
        """Drops the lock (closing the file releases it); a second call does nothing."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def abandon(self) -> None:
        """Removes what this holder made (see `note_created`) and drops the lock, for a start
        or a command that failed before it put anything of its own there: the lock file it
        created, and the directories it created once empty, deepest first. In a data directory
        it created, the empty directories its work left (an object's fan-out directories) go
        too. Only ever `rmdir` and the lock file's `unlink`: whatever anyone else put there
        (another server's data directory beside this one, under a parent both created at once)
        stays, and so does anything that cannot be removed."""
        if self._fd is None:
            return
        try:
            if self.data_dir in self._created:
                _remove_empty_directories(self.data_dir)
            for path in sorted(self._created, key=lambda made: len(made.parts), reverse=True):
                with contextlib.suppress(OSError):
                    if path == self.data_dir / LOCK_FILE_NAME:
                        path.unlink()
                    else:
                        path.rmdir()  # only when empty
            for path in {made.parent for made in self._created}:
                with contextlib.suppress(OSError):
                    sync_directory(path)
        finally:
            self._created = []
            self.release()


def _remove_empty_directories(top: Path) -> None:
    """Removes the empty directories under `top` (not `top`), deepest first."""
    for directory, _, _ in os.walk(top, topdown=False):
        if directory != str(top):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _still_named(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def check_writable(directory: Path) -> None:
    """Raises DataDirectoryNotWritable unless a file can be created in `directory` (and is,
    then removed): a directory of the wrong owner or mode, or on a read-only file system, would
    otherwise fail every write later, one call at a time."""
    probe = directory / f".write-check-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # left by a process of this id that died between the two steps
        fd = os.open(probe, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise DataDirectoryNotWritable(
            f"{directory} is not writable: cannot create a file in it ({exc.strerror or exc})"
        ) from None
    os.close(fd)
    os.unlink(probe)


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


def make_directories(directory: Path) -> list[Path]:
    """`directory.mkdir(parents=True, exist_ok=True)`, with every directory it creates made
    durable: the parent of each is synced, deepest first, so no acknowledged write can lose
    the path to its file in a power cut. Costs one `stat` when the directory exists. Returns
    the directories it created, deepest first."""
    if directory.is_dir():
        return []
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
    return missing


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
