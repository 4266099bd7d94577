"""What a delete costs in the WAL, and what a large transaction leaves of the WAL file.

Debian's SQLite (the Docker image's too) zeroes every page a delete frees, so each freed page
went through the WAL: clearing a 60 MB session needed 60 MB of free disk and failed
STORAGE_FULL on a full one, where a delete is what an operator runs to make room. And a
checkpoint leaves the WAL file at its largest size, so after clearing 83 MB an object that kept
taking a write a second kept an 83 MB WAL until it went quiet (space audit, session 48)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from sessions_server.storage import schema
from sessions_server.storage.store import WriteContext
from tests.storage.test_checkpoints import frames
from tests.storage.test_write_threads import note, opened

PAGE_SIZE = 16 * 1024


def _delete_notes(ctx: WriteContext) -> None:
    ctx.conn.execute("DELETE FROM notes")


def _insert_notes(count: int, size: int) -> Callable[[WriteContext], None]:
    def run(ctx: WriteContext) -> None:
        ctx.conn.executemany("INSERT INTO notes (body) VALUES (?)", (("z" * size,) for _ in range(count)))

    return run


def test_a_delete_writes_the_pages_it_changes_not_every_page_it_frees(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int]:
        async with opened(path, None) as store:
            for _ in range(30):  # about 570 pages, short of a checkpoint (1,000 frames)
                await store.write(note("x" * 300_000))
            before = frames(path)[0]
            await store.write(_delete_notes)
            return before, frames(path)[0]

    before, after = asyncio.run(scenario())
    with sqlite3.connect(path) as conn:
        freed = conn.execute("PRAGMA freelist_count").fetchone()[0]
    assert freed >= 500, freed  # the delete did free the notes' pages
    assert after - before < 20, f"the delete wrote {after - before} frames to free {freed} pages"


def test_the_wal_file_is_cut_back_after_a_large_transaction_is_checkpointed(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"
    wal_file = Path(f"{path}-wal")

    async def scenario() -> tuple[int, int]:
        async with opened(path, None) as store:
            await store.write(_insert_notes(50, 1_000_000))  # about 3,100 frames in one commit
            await store.settled()  # and its checkpoint
            grown = wal_file.stat().st_size
            await store.write(note("the next write starts the WAL over"))
            return grown, wal_file.stat().st_size

    grown, after = asyncio.run(scenario())
    assert grown > 50 * 1_000_000
    assert after <= schema.WAL_SIZE_LIMIT_BYTES, f"{after} bytes of WAL left after the next write"
    assert os.path.getsize(path) > 50 * 1_000_000  # the notes themselves are in the database
