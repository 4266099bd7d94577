"""An object exists once a write committed to it: a file the registry's open made goes again when
the last use of it ends with nothing committed (its first writes were refused as they ran), and
only then."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.store import WriteContext

KEY = "first-write"


class Refused(Exception):
    pass


def refused(ctx: WriteContext) -> None:
    ctx.conn.execute("INSERT OR REPLACE INTO _cf_KV (key, value) VALUES ('marker', 'x')")
    raise Refused  # after it wrote: the job's transaction rolls back


def marked(ctx: WriteContext) -> None:
    ctx.conn.execute("INSERT OR REPLACE INTO _cf_KV (key, value) VALUES ('marker', 'x')")


@asynccontextmanager
async def registry(data_dir: Path, *, discard_unwritten: bool = True) -> AsyncIterator[ObjectRegistry]:
    executor = ThreadPoolExecutor(max_workers=2)
    made = ObjectRegistry(data_dir, executor, discard_unwritten=discard_unwritten)
    try:
        yield made
    finally:
        await made.close_all()
        executor.shutdown()


def test_a_file_made_for_refused_writes_goes_with_its_last_use(tmp_path: Path) -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        async with registry(tmp_path) as objects:
            async with objects.use(KEY) as store:
                with pytest.raises(Refused):
                    await store.write(refused)
                made = object_path(tmp_path, KEY).exists()
            return made, objects.is_open(KEY), object_path(tmp_path, KEY).exists()

    assert asyncio.run(scenario()) == (True, False, False)


def test_a_file_stays_once_a_write_committed(tmp_path: Path) -> None:
    async def scenario() -> bool:
        async with registry(tmp_path) as objects:
            async with objects.use(KEY) as store:
                with pytest.raises(Refused):
                    await store.write(refused)
                await store.write(marked)
            return object_path(tmp_path, KEY).exists()

    assert asyncio.run(scenario())


def test_a_use_that_committed_keeps_the_file_another_use_made(tmp_path: Path) -> None:
    async def scenario() -> tuple[bool, bool]:
        async with registry(tmp_path) as objects:
            first = objects.use(KEY)
            store = await first.__aenter__()
            async with objects.use(KEY) as same:
                assert same is store
                await same.write(marked)
            with pytest.raises(Refused):
                await store.write(refused)
            await first.__aexit__(None, None, None)
            return objects.is_open(KEY), object_path(tmp_path, KEY).exists()

    assert asyncio.run(scenario()) == (True, True)


def test_a_file_from_before_stays_when_its_writes_are_refused(tmp_path: Path) -> None:
    """A file this open did not make (an earlier run's, an import's) is the object's."""

    async def scenario() -> bool:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(marked)
        async with registry(tmp_path) as objects:
            async with objects.use(KEY) as store:
                with pytest.raises(Refused):
                    await store.write(refused)
            return object_path(tmp_path, KEY).exists()

    assert asyncio.run(scenario())


def test_a_use_arriving_during_the_removal_writes_to_a_new_file(tmp_path: Path) -> None:
    """It waits for the removal, then opens (makes) the file again: its write is not lost to
    the file removed."""

    async def scenario() -> None:
        async with registry(tmp_path) as objects:

            async def write_later() -> None:
                async with objects.use(KEY) as store:
                    await store.write(marked)

            async with objects.use(KEY) as store:
                with pytest.raises(Refused):
                    await store.write(refused)
                later = asyncio.create_task(write_later())
            await later

    asyncio.run(scenario())
    with sqlite3.connect(object_path(tmp_path, KEY)) as conn:
        assert conn.execute("SELECT value FROM _cf_KV WHERE key = 'marker'").fetchall() == [("x",)]


def test_a_registry_not_told_to_keeps_the_files_its_opens_made(tmp_path: Path) -> None:
    async def scenario() -> bool:
        async with registry(tmp_path, discard_unwritten=False) as objects, objects.use(KEY) as store:
            with pytest.raises(Refused):
                await store.write(refused)
        return object_path(tmp_path, KEY).exists()

    assert asyncio.run(scenario())
