"""Where an object's file lives: a path derived from a hash of its key, never from the key.

`<data_dir>/objects/ab/cd/<sha256 of key>.sqlite`: hostile keys (`../x`, absolute paths, NUL,
very long strings) cannot reach outside the data directory, and no folder grows too large. The
two directories are made with an object's file and removed with the last object in them (an
erase left them behind: 5,745 empty ones after 6,000 keys were erased, walked by every listing).
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path

OBJECTS_DIR = "objects"
FILE_SUFFIX = ".sqlite"
_FILE_NAME = re.compile(r"[0-9a-f]{64}" + re.escape(FILE_SUFFIX))


def object_file_name(object_key: str) -> str:
    """The file name of an object: the hex SHA-256 of its UTF-8 key."""
    return hashlib.sha256(object_key.encode("utf-8", "surrogatepass")).hexdigest() + FILE_SUFFIX


def is_object_file_name(name: str) -> bool:
    """Whether `name` is one `object_file_name` could have given."""
    return _FILE_NAME.fullmatch(name) is not None


def object_path(data_dir: Path, object_key: str) -> Path:
    """The full path of an object's SQLite file under `data_dir`."""
    name = object_file_name(object_key)
    return data_dir / OBJECTS_DIR / name[0:2] / name[2:4] / name


FANOUT_LOCK = threading.Lock()
"""Held while an object's directories are made and its file created in them, and while empty
ones are removed: a removal never takes a directory from under a file about to be made."""


def prune_object_directories(path: Path) -> None:
    """Removes the directories of the object file `path` (`objects/ab/cd/`, then `objects/ab/`)
    that are empty; anything else is left alone."""
    if path.parent.parent.parent.name != OBJECTS_DIR:
        return  # not an object's file where `object_path` puts one
    with FANOUT_LOCK:
        for directory in (path.parent, path.parent.parent):
            try:
                directory.rmdir()
            except OSError:  # not empty (or gone): the one above it is not empty either
                return
