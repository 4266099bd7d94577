"""A new object's file is written from an image of an empty object's file (`schema.new_file_image`),
staged in scratch and renamed into place (`files.stage_new_object_file`), where SQLite used to make
it by running the schema's DDL in it: the same file, for less work. Real files, real SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.storage import files, schema
from sessions_server.storage.paths import object_path
from sessions_server.storage.store import ObjectStore

# The header's fields that say how the file is laid out and read, as (offset, length): page
# size, write and read versions (WAL), reserved bytes and payload fractions, page count, the
# first freelist page and count, schema format, cache size, largest root page (auto-vacuum),
# text encoding, user version, incremental vacuum, application id. The change counters, the
# schema cookie and the version that last wrote the file are not layout.
LAYOUT_FIELDS = ((16, 2), (18, 1), (19, 1), (20, 1), (21, 3), (28, 4), (32, 4), (36, 4), (44, 4), (48, 4))
LAYOUT_FIELDS += ((52, 4), (56, 4), (60, 4), (64, 4), (68, 4))


def _open_and_close(path: Path, key: str, staging: Path | None) -> None:
    async def run() -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        try:
            store = ObjectStore.open(key, path, executor, staging=staging)
            await store.close()
        finally:
            executor.shutdown(wait=True)

    asyncio.run(run())


@contextlib.contextmanager
def _read(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        yield conn
    finally:
        conn.close()


def _described(path: Path) -> dict[str, object]:
    with _read(path) as conn:
        described: dict[str, object] = {
            "schema": conn.execute(
                "SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master ORDER BY name"
            ).fetchall(),
            "page_count": conn.execute("PRAGMA page_count").fetchone()[0],
            "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "integrity": conn.execute("PRAGMA integrity_check").fetchall(),
            "meta": conn.execute("SELECT key, value FROM _sessions_meta ORDER BY key").fetchall(),
            "kv": conn.execute("SELECT key, value, typeof(value) FROM _cf_KV").fetchall(),
        }
    header = path.read_bytes()[:100]
    described["header"] = [header[offset : offset + length] for offset, length in LAYOUT_FIELDS]
    return described


def test_a_new_file_written_from_the_image_is_the_file_the_ddl_makes(tmp_path: Path) -> None:
    from_image = tmp_path / "objects" / "image.sqlite"
    from_ddl = tmp_path / "objects" / "ddl.sqlite"
    _open_and_close(from_image, "k", tmp_path / "scratch")
    _open_and_close(from_ddl, "k", None)
    image, ddl = _described(from_image), _described(from_ddl)
    assert image == ddl
    assert image["meta"] == [(schema.FILE_FORMAT_KEY, str(schema.FILE_FORMAT)), ("object_key", "k")]
    assert image["journal_mode"] == "wal" and image["integrity"] == [("ok",)]
    assert not list((tmp_path / "scratch").iterdir())  # neither the image's build nor the staged file


def test_a_new_file_cut_short_before_its_records_is_made_the_objects_at_the_next_open(tmp_path: Path) -> None:
    """A crash after the staged file took its name, before its first commit: the file holds the
    schema and nothing recorded, and the next open records the key, as for an upgraded file."""
    path = object_path(tmp_path / "data", "cut-short")
    staging = tmp_path / "data" / "scratch"
    assert files.install_new_object_file(files.stage_new_object_file(path, staging), path)
    with _read(path) as conn:
        assert conn.execute("SELECT count(*) FROM _sessions_meta").fetchone()[0] == 0

    _open_and_close(path, "cut-short", staging)
    made = tmp_path / "made.sqlite"
    _open_and_close(made, "cut-short", staging)
    assert _described(path) == _described(made)


def test_a_staged_file_does_not_replace_a_file_that_is_there(tmp_path: Path) -> None:
    path = tmp_path / "objects" / "there.sqlite"
    _open_and_close(path, "there", None)
    before = path.read_bytes()
    staged = files.stage_new_object_file(path, tmp_path / "scratch")
    assert not files.install_new_object_file(staged, path)
    assert path.read_bytes() == before
    assert not staged.exists()


@pytest.mark.parametrize("left", [("-wal",), ("-wal", "-shm")])
def test_a_wal_left_without_its_file_is_removed_before_a_new_file_takes_the_name(
    tmp_path: Path, left: tuple[str, ...]
) -> None:
    """A removal a crash cut short can leave an object's WAL without its file: SQLite reads the
    WAL of a file with pages into it (into an empty file, as it makes one, it reads none)."""
    old = tmp_path / "objects" / "old.sqlite"
    _open_and_close(old, "key", None)
    conn = sqlite3.connect(old, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("INSERT INTO _sessions_meta (key, value) VALUES ('left', 'behind')")
    wal = {suffix: Path(f"{old}{suffix}").read_bytes() for suffix in left}  # the commit, still in the WAL
    conn.close()
    path = tmp_path / "objects" / "new.sqlite"
    for suffix, data in wal.items():
        Path(f"{path}{suffix}").write_bytes(data)

    _open_and_close(path, "key", tmp_path / "scratch")
    with _read(path) as read:
        assert read.execute("SELECT value FROM _sessions_meta WHERE key = 'left'").fetchall() == []
        assert read.execute("SELECT value FROM _sessions_meta WHERE key = 'object_key'").fetchone() == ("key",)
