"""What a connection remembers about the search index (storage/queries.py `fts_exists`).

The index is created only by an object's writer, by the first search. The writer therefore
remembers that it is absent (so appends do not look it up) until it creates it; a creation that
rolls back leaves it absent; readers never remember an absence, since the writer may create the
index at any time."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.storage import queries
from sessions_server.storage.store import ObjectStore, WriteContext


class BuildFailed(Exception):
    pass


def on_disk(path: Path) -> bool:
    with sqlite3.connect(path) as conn:
        return queries.fts_exists(conn)


def indexed_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [str(row[0]) for row in conn.execute("SELECT id FROM cf_agents_session_fts ORDER BY id")]


def index_text(message_id: str) -> Callable[[WriteContext], int]:
    def run(ctx: WriteContext) -> int:
        return queries.index_search_text(ctx.conn, "", message_id, "user", f"text of {message_id}", replace=False)

    return run


def failing_build(ctx: WriteContext) -> None:
    queries.create_fts(ctx.conn)
    assert queries.fts_exists(ctx.conn)  # inside the transaction the new table is visible
    raise BuildFailed("the backfill failed")


def test_the_writer_remembers_absence_until_it_creates_the_index(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> list[tuple[str, object]]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=2)
        store = await loop.run_in_executor(executor, ObjectStore.open, "key", path, executor)
        seen: list[tuple[str, object]] = []
        try:
            seen.append(("append before any index writes", await store.write(index_text("a"))))
            seen.append(("reader before", await store.read(queries.fts_exists)))
            with pytest.raises(BuildFailed):
                await store.write(failing_build)
            seen.append(("on disk after the failed build", on_disk(path)))
            seen.append(("append after the failed build writes", await store.write(index_text("b"))))
            await store.write(lambda ctx: queries.create_fts(ctx.conn))
            seen.append(("append after the build writes", await store.write(index_text("c"))))
            seen.append(("reader after", await store.read(queries.fts_exists)))
            store.search_index_committed()
            seen.append(("append once remembered writes", await store.write(index_text("d"))))
        finally:
            await store.close()
            executor.shutdown()
        return seen

    assert asyncio.run(scenario()) == [
        ("append before any index writes", 0),
        ("reader before", False),
        ("on disk after the failed build", False),
        ("append after the failed build writes", 0),
        ("append after the build writes", 1),
        ("reader after", True),
        ("append once remembered writes", 1),
    ]
    assert indexed_ids(path) == ["c", "d"]


def lookup_index_on_disk(path: Path) -> bool:
    with sqlite3.connect(path) as conn:
        found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = '_sessions_fts_by_message'").fetchone()
        return found is not None


def test_a_build_that_rolls_back_leaves_nothing_remembered_of_it(tmp_path: Path) -> None:
    """The index that finds a message's index rows by key was remembered as made by a build
    that rolled back (a full disk, say): the next build did not make it, and its backfill then
    read the whole index for each message (48 s, not 0.4 s, for 40,000)."""
    from sessions_server.domain.search_index import start_index

    path = tmp_path / "object.sqlite"

    def failing_start(ctx: WriteContext) -> None:
        start_index(ctx)
        assert ctx.conn.fts_lookup_ensured  # type: ignore[attr-defined]  # noted inside the transaction
        raise BuildFailed("the backfill failed")

    async def scenario() -> tuple[bool, bool, bool]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=2)
        store = await loop.run_in_executor(executor, ObjectStore.open, "key", path, executor)
        try:
            with pytest.raises(BuildFailed):
                await store.write(failing_start)
            after_failure = on_disk(path) or lookup_index_on_disk(path)
            await store.write(start_index)
            return after_failure, on_disk(path), lookup_index_on_disk(path)
        finally:
            await store.close()
            executor.shutdown()

    assert asyncio.run(scenario()) == (False, True, True)
