"""Where an object closes (storage/store.py `ObjectStore.close`).

An object that wrote nothing since it opened (its WAL empty, its row count saved) closes on the
calling thread (the event loop's) when the server is quiet: the close only releases its
connections, and handing it to a thread cost a cold object's request more CPU than the close
itself (an LRU eviction per request when many objects take turns). A close that checkpoints or
saves the row count, and every close while other calls are in flight, runs on the executor."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from sessions_server.storage import registry as registry_module
from sessions_server.storage.paths import object_path
from sessions_server.storage.store import ObjectStore
from tests.storage.test_registry_opens import add_note, read_notes, registry


@pytest.fixture(autouse=True)
def any_open_is_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """However slowly this machine opens files, these tests count it as quick."""
    monkeypatch.setattr(registry_module, "INLINE_OPEN_MAX_SECONDS", 60.0)


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Every close as (object key, ran on the test's thread)."""
    calls: list[tuple[str, bool]] = []
    test_thread = threading.get_ident()
    close_blocking = ObjectStore._close_blocking

    def recording(store: ObjectStore, *args: Any) -> None:
        calls.append((store.object_key, threading.get_ident() == test_thread))
        close_blocking(store, *args)

    monkeypatch.setattr(ObjectStore, "_close_blocking", recording)
    return calls


def notes_in_file(path: Path) -> list[str]:
    """The notes the database file itself holds: read with the WAL file set aside, if any."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)) as conn:
        return read_notes(conn)


async def written_and_closed(data_dir: Path, key: str, *bodies: str) -> None:
    async with registry(data_dir, None) as objects, objects.use(key) as store:
        for body in bodies:
            await store.write(add_note(body))


def sidecars(data_dir: Path, key: str) -> list[str]:
    path = object_path(data_dir, key)
    return sorted(p.name.removeprefix(path.name) for p in path.parent.iterdir() if p.name != path.name)


def test_a_quiet_close_of_an_object_that_wrote_nothing_runs_in_place(
    tmp_path: Path, closes: list[tuple[str, bool]]
) -> None:
    async def scenario() -> tuple[list[str], int]:
        await written_and_closed(tmp_path, "a", "one")
        closes.clear()
        async with registry(tmp_path, lambda: 1) as objects:
            async with objects.use("a") as store:
                notes = await store.read(read_notes, quick=True)
            await objects.close_object("a")
            return notes, store.inline_closes

    notes, inline_closes = asyncio.run(scenario())
    assert closes == [("a", True)]
    assert (notes, inline_closes) == (["one"], 1)
    assert sidecars(tmp_path, "a") == []  # the last connection really closed: SQLite removed -wal and -shm
    assert notes_in_file(object_path(tmp_path, "a")) == ["one"]


def test_an_object_evicted_while_the_server_is_quiet_closes_in_place(
    tmp_path: Path, closes: list[tuple[str, bool]]
) -> None:
    async def scenario() -> list[str]:
        await written_and_closed(tmp_path, "a", "one")
        await written_and_closed(tmp_path, "b", "two")
        closes.clear()
        async with registry(tmp_path, lambda: 1, max_open=1) as objects:
            async with objects.use("a") as store:
                await store.read(read_notes, quick=True)
            async with objects.use("b") as store:  # "a" is evicted as "b" is released
                notes = await store.read(read_notes, quick=True)
            await objects.close_object("a")  # waits for the eviction's close
            return notes

    assert asyncio.run(scenario()) == ["two"]
    assert closes[0] == ("a", True)


@pytest.mark.parametrize(
    ("calls", "writes"),
    [(lambda: 2, False), (None, False), (lambda: 1, True)],
    ids=["another call in flight", "no call count", "a write to checkpoint"],
)
def test_other_closes_run_on_the_executor(
    tmp_path: Path, closes: list[tuple[str, bool]], calls: Callable[[], int] | None, writes: bool
) -> None:
    async def scenario() -> int:
        await written_and_closed(tmp_path, "a", "one")
        closes.clear()
        async with registry(tmp_path, calls) as objects:
            async with objects.use("a") as store:
                if writes:
                    await store.write(add_note("two"))
            await objects.close_object("a")
            return store.inline_closes

    assert asyncio.run(scenario()) == 0
    assert closes == [("a", False)]
    assert sidecars(tmp_path, "a") == []
    # The write is in the database file: the close checkpointed the WAL before it went.
    assert notes_in_file(object_path(tmp_path, "a")) == (["one", "two"] if writes else ["one"])
