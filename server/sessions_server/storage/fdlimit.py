"""The process's budget of file descriptors, which open objects spend.

An open object holds its writer connection and up to four reader connections, each with the
file, its WAL and its shared memory open. With a hard limit too low for `--max-open-objects` (the
start raises the soft limit to the hard one, `cli._raise_open_files_limit`), opens failed for
want of descriptors, and since no object below the bound is ever closed to make room, every
later open failed too, for good. So the bound is lowered to what fits, and an open that runs out
of descriptors anyway (busy objects are not closed for the bound) is told apart, so that idle
objects are closed and the caller told to retry.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

try:
    import resource
except ImportError:  # not on this platform: nothing to raise or measure
    resource = None  # type: ignore[assignment]

FDS_PER_OBJECT = 15  # a writer and four readers, three files each
# Listening and client sockets, the executor's threads' files, imports and exports under way.
RESERVED_FDS = 256
_FD_DIRECTORY = "/proc/self/fd"


def soft_limit() -> int | None:
    """RLIMIT_NOFILE's soft limit; None where there is none."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def objects_that_fit(soft_limit: int) -> int:
    """How many objects may be open at once within `soft_limit` descriptors (at least one)."""
    return max(1, (soft_limit - RESERVED_FDS) // FDS_PER_OBJECT)


def is_out_of_descriptors(exc: BaseException, path: Path) -> bool:
    """Whether a failed open of `path` was the process (or the system) out of file descriptors.
    SQLite reports that as "unable to open database file", as it does a missing directory or a
    denied permission: so those are ruled out, and many descriptors must be in use (counted
    after the failure, when other calls may have closed some)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.EMFILE, errno.ENFILE)
    if not isinstance(exc, sqlite3.OperationalError) or "unable to open" not in str(exc) or resource is None:
        return False
    directory = next(parent for parent in path.parents if parent.exists())  # a new object's may not
    if not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        return False
    try:
        in_use = len(os.listdir(_FD_DIRECTORY))
    except OSError as listing:  # the listing needs a descriptor too
        return listing.errno in (errno.EMFILE, errno.ENFILE)
    soft = soft_limit()
    return soft is not None and in_use >= soft // 4
