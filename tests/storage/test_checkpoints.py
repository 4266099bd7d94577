"""When an object's WAL is checkpointed (storage/wal.py, storage/store.py).

SQLite would checkpoint inside the commit that brings the WAL to 1,000 frames, so that write's
answer would wait for it. The store answers the write first and then checkpoints on the writer,
where writes that arrive meanwhile wait and commit together after it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.storage import store as store_module
from sessions_server.storage import wal
from sessions_server.storage.rows import StorageError
from sessions_server.storage.store import ObjectStore
from tests.storage.test_write_threads import note, opened

NOTE = "x" * 200_000  # about 13 frames at 16 KiB pages; small enough to commit in place


def frames(path: Path) -> tuple[int, int]:
    """(frames in the WAL, frames checkpointed), read from the wal-index as the store reads it."""
    index = wal.WalIndex.open(path)
    assert index is not None
    try:
        return index.frames()
    finally:
        index.close()


def test_the_write_that_fills_the_wal_is_answered_before_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> int:
        written = 0
        async with opened(path, lambda: 1) as store:
            seen = (0, 0)
            while seen[0] < wal.CHECKPOINT_FRAMES:
                await store.write(note(NOTE), size_hint=len(NOTE))
                written += 1
                assert store.checkpoints == 0
                seen = frames(path)
            # Answered in place, with the WAL past SQLite's mark and nothing checkpointed yet.
            assert store.inline_writes > 1
            assert seen[1] == 0, seen
            await store.settled()
            assert store.checkpoints == 1
            assert frames(path) == (seen[0], seen[0])  # all of it copied into the database
            await store.write(note("after"), size_hint=10)
            assert frames(path)[0] < 10  # so the WAL started over from its beginning
        shm = f"{path.resolve()}-shm"  # SQLite may have unlinked it: "(deleted)" follows then
        assert not any(name.startswith(shm) for name in _open_files()), "the wal-index stayed open after close"
        return written

    written = asyncio.run(scenario())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == written + 1


def test_writes_under_steady_load_keep_the_wal_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four writers in a loop, one job per commit: the queue is never empty after a commit, and
    the due checkpoint still runs before the next one (else the WAL would grow to the backstop)."""
    monkeypatch.setattr(store_module, "MAX_JOBS_PER_COMMIT", 1)
    path = tmp_path / "object.sqlite"
    big = "y" * 1_000_000  # about 63 frames

    async def scenario() -> tuple[int, int]:
        async with opened(path, None) as store:  # no count of calls: every write takes the thread
            most = 0

            async def writer() -> None:
                nonlocal most
                for _ in range(25):
                    await store.write(note(big))
                    most = max(most, frames(path)[0])

            await asyncio.gather(*(writer() for _ in range(4)))
            await store.settled()
            return store.checkpoints, most

    checkpoints, most = asyncio.run(scenario())
    assert checkpoints >= 5  # about 6,300 frames written
    assert most < wal.CHECKPOINT_FRAMES + 70, most


def test_a_reader_on_an_old_snapshot_does_not_make_every_commit_checkpoint(tmp_path: Path) -> None:
    """A checkpoint cannot copy frames newer than a reader's snapshot; the store then waits for
    another CHECKPOINT_FRAMES frames before it tries again, rather than retrying per commit."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> list[int]:
        async with opened(path, lambda: 1) as store:
            reader = sqlite3.connect(path, isolation_level=None)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM notes").fetchone()  # holds this snapshot
            counts = []
            while frames(path)[0] < wal.CHECKPOINT_FRAMES:
                await store.write(note(NOTE), size_hint=len(NOTE))
            await store.settled()
            counts.append(store.checkpoints)
            for _ in range(20):  # about 260 frames more: not yet due again
                await store.write(note(NOTE), size_hint=len(NOTE))
                await store.settled()
            counts.append(store.checkpoints)
            reader.execute("COMMIT")
            reader.close()
            for _ in range(2 * wal.CHECKPOINT_FRAMES // 13):  # bounded, should no checkpoint come
                await store.write(note(NOTE), size_hint=len(NOTE))
                await store.settled()
                if store.checkpoints > counts[-1]:
                    break
            mx, backfilled = frames(path)
            counts.append(int(mx == backfilled))  # with the reader gone, the checkpoint copied all
            return counts

    assert asyncio.run(scenario()) == [1, 1, 1]


def _open_files() -> list[str]:
    names = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
    return names


def test_a_checkpoint_the_executor_can_no_longer_run_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint is submitted after the answer; if the executor has shut down by then, the
    writer gives it up and goes on: the store settles, and the next write is refused (with the
    executor's error) instead of waiting forever."""
    # The writes commit in place, leaving the checkpoint to the writer task, however slowly
    # this machine commits (a slow commit sends writes to the writer, which checkpoints at once).
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)
    path = tmp_path / "object.sqlite"

    async def scenario() -> str:
        executor = ThreadPoolExecutor(max_workers=2)
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(executor, ObjectStore.open, "key", path, executor, None, lambda: 1)
        await store.write(lambda ctx: ctx.conn.execute("CREATE TABLE notes (body TEXT NOT NULL)"), size_hint=10)
        while frames(path)[0] < wal.CHECKPOINT_FRAMES:
            await store.write(note(NOTE), size_hint=len(NOTE))
        executor.shutdown()  # before the writer task, scheduled by the last write, has run
        await store.settled()
        assert store.checkpoints == 0
        with pytest.raises(StorageError) as refused:
            await store.write(note("queued"))  # no size hint: the writer thread's path
        return str(refused.value)

    assert "nothing was written" in asyncio.run(scenario())


def test_the_database_size_counts_its_pages_wherever_they_are_and_not_the_wals_old_versions(tmp_path: Path) -> None:
    """`database_bytes`, read from the wal-index, is the database as of its last commit: its
    pages still in the WAL count (the file alone is smaller until a checkpoint), the WAL's older
    versions of a page do not (the file and the WAL together are larger)."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int, int, int]:
        async with opened(path, lambda: 1) as store:
            for _ in range(10):
                await store.write(note(NOTE), size_hint=len(NOTE))
            for _ in range(20):
                await store.write(lambda ctx: ctx.conn.execute("UPDATE notes SET body = body || 'y' WHERE rowid = 1"))
            assert store.checkpoints == 0
            pages, page_size = await store.read(
                lambda conn: (
                    conn.execute("PRAGMA page_count").fetchone()[0],
                    conn.execute("PRAGMA page_size").fetchone()[0],
                )
            )
            return store.database_bytes(), pages * page_size, path.stat().st_size, store.file_bytes()

    database_bytes, counted, file_alone, file_and_wal = asyncio.run(scenario())
    assert database_bytes == counted
    assert file_alone < database_bytes < file_and_wal


def test_a_closed_stores_database_size_reads_no_file_that_took_its_wal_index_descriptor(tmp_path: Path) -> None:
    """After the close, the wal-index's descriptor number is free for the next file opened
    anywhere in the process; reading it then would report that file's bytes as this object's
    size."""
    path = tmp_path / "object.sqlite"
    impostor = tmp_path / "impostor"
    impostor.write_bytes(b"\xff" * 100)

    async def scenario() -> tuple[int, int]:
        async with opened(path, lambda: 1) as store:
            await store.write(note(NOTE), size_hint=len(NOTE))
            index = store._wal_index
            assert index is not None and index._fd is not None
            fd = index._fd
        opened_fds: list[int] = []
        try:
            # The lowest free number comes first: open until the wal-index's is taken.
            while fd not in opened_fds and len(opened_fds) < 64:
                opened_fds.append(os.open(impostor, os.O_RDONLY))
            assert fd in opened_fds
            return store.database_bytes(), path.stat().st_size
        finally:
            for number in opened_fds:
                os.close(number)

    database_bytes, file_size = asyncio.run(scenario())
    assert database_bytes == file_size
