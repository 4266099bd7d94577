"""Quiet objects give their WAL file back (storage/wal.py `QuietTrim`, `ObjectStore.sweep_wal`).

A checkpoint leaves the WAL file at its size, so an open object that once wrote 1,000 frames
kept 16 MiB of WAL while idle. The registry looks at its open objects every sweep; one that
committed nothing since the previous look and whose WAL holds a megabyte or more has it
emptied by a TRUNCATE checkpoint that never waits for a reader."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

from sessions_server.storage import wal
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import WAL_TRIMS_AT_ONCE, ObjectRegistry
from sessions_server.storage.store import ObjectStore, WriteContext
from tests.storage.test_write_threads import note, opened, stored_notes

NOTE = "x" * 200_000  # about 13 frames at 16 KiB pages


def wal_bytes(path: Path) -> int:
    wal_file = Path(f"{path}-wal")
    return wal_file.stat().st_size if wal_file.exists() else 0


async def fill_wal(store: ObjectStore, path: Path) -> None:
    while wal_bytes(path) < 2 * wal.TRIM_MIN_BYTES:
        await store.write(note(NOTE))


def test_a_quiet_objects_wal_file_is_emptied_and_grows_again_after(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> list[int]:
        sizes = []
        async with opened(path, None) as store:
            await fill_wal(store, path)
            store.sweep_wal()  # the first look: written since any before it
            await store.settled()
            sizes.append(wal_bytes(path))
            store.sweep_wal()  # nothing committed since the last look: quiet
            await store.settled()
            sizes.append(wal_bytes(path))
            await store.write(note("after"))  # the emptied WAL takes writes as before
            await fill_wal(store, path)
            store.sweep_wal()
            store.sweep_wal()
            await store.settled()
            sizes.append(wal_bytes(path))
            assert store.wal_trims == 2
        return sizes

    first_look, quiet, quiet_again = asyncio.run(scenario())
    assert first_look >= 2 * wal.TRIM_MIN_BYTES
    assert quiet == 0
    assert quiet_again == 0
    notes = stored_notes(path)
    assert "after" in notes and len(notes) > 2 * wal.TRIM_MIN_BYTES // len(NOTE)


def test_a_write_since_the_last_look_keeps_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int]:
        async with opened(path, None) as store:
            await fill_wal(store, path)
            store.sweep_wal()
            await store.write(note("between the looks"))
            store.sweep_wal()
            await store.settled()
            return wal_bytes(path), store.wal_trims

    size, trims = asyncio.run(scenario())
    assert size >= 2 * wal.TRIM_MIN_BYTES
    assert trims == 0


def test_a_write_queued_behind_the_decision_cancels_the_trim(tmp_path: Path) -> None:
    """The trim runs on the writer after what is queued; a write that came meanwhile ended the
    quiet spell, so the WAL stays (and the write commits on the writer, never beside it)."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int]:
        async with opened(path, None) as store:
            await fill_wal(store, path)
            store.sweep_wal()
            store.sweep_wal()  # due: the writer task is started, not yet run
            await store.write(note("arrived after the decision"))
            await store.settled()
            return wal_bytes(path), store.wal_trims

    size, trims = asyncio.run(scenario())
    assert size >= 2 * wal.TRIM_MIN_BYTES
    assert trims == 0
    assert stored_notes(path)[-1] == "arrived after the decision"


def _notes_in_the_database_file_alone(path: Path, tmp_path: Path) -> list[str]:
    """What a copy of the database file without its WAL holds (a backup that copied only the
    file, or a WAL the disk lost)."""
    alone = tmp_path / "alone.sqlite"
    alone.write_bytes(path.read_bytes())
    try:
        return stored_notes(alone)
    except sqlite3.OperationalError:  # no such table: the file is still the empty one created
        return []


def test_a_small_wal_stays_and_its_frames_go_into_the_database(tmp_path: Path) -> None:
    """A small WAL is not emptied (recreating it after every pause costs more than it gives
    back), but a quiet object's writes are copied into its database file: a small object open
    for days otherwise kept them in its WAL alone."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int, int, list[str], list[str], list[str]]:
        async with opened(path, None) as store:
            await store.write(note("small"))
            before = wal_bytes(path)
            written = _notes_in_the_database_file_alone(path, tmp_path)
            store.sweep_wal()
            store.sweep_wal()  # quiet: its frames are copied
            await store.settled()
            copied = _notes_in_the_database_file_alone(path, tmp_path)
            await store.write(note("later"))
            store.sweep_wal()  # written since the last look: not quiet
            await store.settled()
            not_yet = _notes_in_the_database_file_alone(path, tmp_path)
            return before, wal_bytes(path), store.wal_trims, written, copied, not_yet

    before, after, trims, written, copied, not_yet = asyncio.run(scenario())
    assert written == []  # only in the WAL until the sweep
    assert copied == ["small"]
    assert not_yet == ["small"]
    assert 0 < before < wal.TRIM_MIN_BYTES
    assert after == before  # the next write reused the file from its beginning
    assert trims == 0


def test_a_reader_holding_a_snapshot_keeps_the_wal_and_is_not_waited_for(tmp_path: Path) -> None:
    """As a replicator's (Litestream's) read transaction does: the TRUNCATE gives up at once,
    is not tried again in the same quiet spell, and the next spell's try succeeds once the
    reader is gone."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int, int, int]:
        async with opened(path, None) as store:
            await fill_wal(store, path)
            with closing(sqlite3.connect(path, isolation_level=None)) as reader:
                reader.execute("BEGIN")
                reader.execute("SELECT count(*) FROM notes").fetchone()
                store.sweep_wal()
                store.sweep_wal()  # due: tried, and given up at once
                await store.settled()
                held = wal_bytes(path)
                reader.execute("COMMIT")
            store.sweep_wal()  # the same quiet spell: not tried again
            await store.settled()
            same_spell = wal_bytes(path)
            tries_then = store.wal_trims
            await store.write(note("a new spell"))
            store.sweep_wal()
            store.sweep_wal()
            await store.settled()
            return held, same_spell, tries_then, wal_bytes(path)

    held, same_spell, trims_then, next_spell = asyncio.run(scenario())
    assert held >= 2 * wal.TRIM_MIN_BYTES
    assert same_spell == held
    assert trims_then == 0
    assert next_spell == 0
    assert stored_notes(path)[-1] == "a new spell"


def test_the_registry_sweeps_its_open_objects_on_a_timer(tmp_path: Path) -> None:
    executor = ThreadPoolExecutor(max_workers=2)
    key = "busy-then-quiet"

    def create_notes(ctx: WriteContext) -> None:
        ctx.conn.execute("CREATE TABLE IF NOT EXISTS notes (body TEXT NOT NULL)")

    async def scenario() -> int:
        registry = ObjectRegistry(tmp_path, executor, wal_sweep_seconds=0.05)
        try:
            async with registry.use(key) as store:
                await store.write(create_notes)
                await fill_wal(store, object_path(tmp_path, key))
            filled = wal_bytes(object_path(tmp_path, key))
            assert filled >= 2 * wal.TRIM_MIN_BYTES
            # The timer's sweeps run on this loop: wait (bounded) for the second of them.
            for _ in range(1000):
                if store.wal_trims:
                    break
                await asyncio.sleep(0.01)
            await store.settled()
            return wal_bytes(object_path(tmp_path, key))
        finally:
            await registry.close_all()

    try:
        assert asyncio.run(scenario()) == 0
    finally:
        executor.shutdown()


def test_a_sweep_runs_its_trims_a_few_objects_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trim holds a commit thread while its checkpoint syncs: a sweep that started every
    quiet object's at once held all of them, and a busy object's append waited behind them."""
    entered, release = threading.Semaphore(0), threading.Event()
    checkpoint = ObjectStore._checkpoint

    def held_checkpoint(store: ObjectStore) -> None:
        entered.release()
        release.wait(60)
        checkpoint(store)

    monkeypatch.setattr(ObjectStore, "_checkpoint", held_checkpoint)
    executor, commits = ThreadPoolExecutor(max_workers=2), ThreadPoolExecutor(max_workers=8)
    data = tmp_path / "data"

    def create_notes(ctx: WriteContext) -> None:
        ctx.conn.execute("CREATE TABLE IF NOT EXISTS notes (body TEXT NOT NULL)")

    async def scenario() -> tuple[int, list[str]]:
        registry = ObjectRegistry(data, executor, wal_sweep_seconds=0, commit_executor=commits)
        stores = []
        try:
            for index in range(6):
                async with registry.use(f"quiet-{index}") as store:
                    await store.write(create_notes)
                    await store.write(note(f"in the WAL of {index}"))
                stores.append(store)
            registry.sweep_wals()  # the first look: written since any before it
            registry.sweep_wals()  # quiet: every one's frames are due to be copied
            for _ in range(WAL_TRIMS_AT_ONCE):
                assert await asyncio.to_thread(entered.acquire, True, 60)
            trimming = sum(store.busy for store in stores)
            release.set()
            for _ in range(len(stores) - WAL_TRIMS_AT_ONCE):  # the others' turns come
                assert await asyncio.to_thread(entered.acquire, True, 60)
            # Every turn taken (a count of checkpoints entered could include one object's twice,
            # and a CI run read an object whose own turn had not come yet).
            await asyncio.gather(*registry._wal_trims)
            for store in stores:
                await store.settled()
            return trimming, [
                text
                for index in range(len(stores))
                for text in _notes_in_the_database_file_alone(object_path(data, f"quiet-{index}"), tmp_path)
            ]
        finally:
            release.set()
            await registry.close_all()

    try:
        trimming, notes = asyncio.run(scenario())
    finally:
        executor.shutdown()
        commits.shutdown()
    assert trimming == WAL_TRIMS_AT_ONCE
    assert notes == [f"in the WAL of {index}" for index in range(6)]
