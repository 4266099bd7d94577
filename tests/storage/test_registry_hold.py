"""`ObjectRegistry.closed`: an object stays closed while its file is replaced or removed.

ImportObject (replace) and DeleteObject swap or remove an object's file. A request that arrived
meanwhile must not reopen the old file, or its acknowledged writes would go to an unlinked
inode; it waits and then opens the new file."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from sessions_server.storage import files
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.store import WriteContext

KEY = "held-object"


def set_marker(value: str) -> Callable[[WriteContext], None]:
    def run(ctx: WriteContext) -> None:
        ctx.conn.execute("INSERT OR REPLACE INTO _cf_KV (key, value) VALUES ('marker', ?)", (value,))

    return run


def read_marker(conn: sqlite3.Connection) -> str:
    return str(conn.execute("SELECT value FROM _cf_KV WHERE key = 'marker'").fetchone()[0])


@asynccontextmanager
async def registry_with_marker(data_dir: Path, marker: str) -> AsyncIterator[ObjectRegistry]:
    executor = ThreadPoolExecutor(max_workers=4)
    registry = ObjectRegistry(data_dir, executor)
    try:
        async with registry.use(KEY) as store:
            await store.write(set_marker(marker))
        yield registry
    finally:
        await registry.close_all()
        executor.shutdown()


def replacement_file(data_dir: Path, tmp_path: Path, marker: str) -> Path:
    """A copy of the object's file whose marker says `marker`."""
    copy = tmp_path / "replacement.sqlite"
    with sqlite3.connect(object_path(data_dir, KEY)) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    with sqlite3.connect(copy, isolation_level=None) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("UPDATE _cf_KV SET value = ? WHERE key = 'marker'", (marker,))
    return copy


async def marker_of(registry: ObjectRegistry) -> str:
    async with registry.use(KEY) as store:
        return await store.read(read_marker)


def test_a_request_during_the_block_waits_and_opens_the_new_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async def scenario() -> tuple[bool, str, str]:
        async with registry_with_marker(data_dir, "old") as registry:
            replacement = replacement_file(data_dir, tmp_path, "new")
            async with registry.closed(KEY):
                waiting = asyncio.create_task(marker_of(registry))
                await asyncio.to_thread(files.import_store_file, replacement, KEY, data_dir, replace=True)
                open_during_block = registry.is_open(KEY)
            return open_during_block, await waiting, await marker_of(registry)

    assert asyncio.run(scenario()) == (False, "new", "new")


def test_an_open_under_way_when_the_block_begins_is_closed_before_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async def scenario() -> tuple[str, bool, str]:
        async with registry_with_marker(data_dir, "old") as registry:
            await registry.close_object(KEY)
            replacement = replacement_file(data_dir, tmp_path, "new")
            opening = asyncio.create_task(marker_of(registry))
            await asyncio.sleep(0)  # one turn of the loop: the task is now opening the file
            async with registry.closed(KEY):
                open_during_block = registry.is_open(KEY)
                await asyncio.to_thread(files.import_store_file, replacement, KEY, data_dir, replace=True)
            return await opening, open_during_block, await marker_of(registry)

    assert asyncio.run(scenario()) == ("old", False, "new")


def test_blocks_on_one_object_take_turns(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async def scenario() -> list[str]:
        order: list[str] = []
        async with registry_with_marker(data_dir, "old") as registry:
            second_entered = asyncio.Event()

            async def second() -> None:
                async with registry.closed(KEY):
                    order.append("second in")
                    second_entered.set()

            async with registry.closed(KEY):
                task = asyncio.create_task(second())
                await asyncio.to_thread(lambda: None)  # the second block had turns to enter
                order.append("first out")
            await second_entered.wait()
            await task
        return order

    assert asyncio.run(scenario()) == ["first out", "second in"]
