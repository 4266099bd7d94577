"""Whole object files in and out: importing a store written by upstream (or by another server).

The file format is upstream's, so importing is a consistent copy (SQLite's backup API, which also
takes what sits in a WAL) into the object's path, followed by the same open as every object gets:
schema upgrade, key record, and the legacy lift.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from sessions_server.storage import schema
from sessions_server.storage.paths import object_path


class StoreImportError(Exception):
    """The file cannot be imported (missing, not SQLite, or the object exists)."""


def import_store_file(source: Path, object_key: str, data_dir: Path, *, replace: bool = False) -> Path:
    """Copies `source` in as `object_key`; returns the object's path. Run while the server that
    owns `data_dir` is stopped, or for a key it has not opened."""
    if not source.is_file():
        raise StoreImportError(f"{source} is not a file")
    target = object_path(data_dir, object_key)
    if target.exists() and not replace:
        raise StoreImportError(f"object {object_key!r} already exists (use --replace)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".importing")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        dst = sqlite3.connect(partial)
        try:
            src.backup(dst)
        finally:
            src.close()
        with contextlib.closing(dst):
            dst.isolation_level = None
            if schema.table_exists(dst, "_sessions_meta"):  # the copy takes the new key
                dst.execute("DELETE FROM _sessions_meta WHERE key = 'object_key'")
            schema.initialize(dst, object_key)
    except sqlite3.DatabaseError as exc:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise StoreImportError(f"{source} is not a usable SQLite store: {exc}") from exc
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            Path(str(target) + suffix).unlink()
    partial.replace(target)
    return target
