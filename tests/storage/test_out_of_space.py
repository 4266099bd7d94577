"""A storage failure is told apart as "out of space" (STORAGE_FULL: free space and retry) or not
(STORAGE_FAILURE) by SQLite's result code and the OS error number, never by the message's words."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain.errors import LimitExceeded, StorageFailure
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent, StorageError, is_out_of_space


def _sqlite_full(tmp_path: Path) -> sqlite3.Error:
    """A real SQLITE_FULL: a file capped at its current page count asked to grow."""
    with contextlib.closing(sqlite3.connect(tmp_path / "capped.sqlite")) as conn:
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.commit()
        conn.execute("PRAGMA max_page_count = 2")
        with pytest.raises(sqlite3.Error) as full:
            conn.execute("INSERT INTO t VALUES (?)", ("x" * 100_000,))
        return full.value


def _sqlite_other(tmp_path: Path) -> sqlite3.Error:
    """A SQLite failure that is not about space, though its message says "full"."""
    with contextlib.closing(sqlite3.connect(tmp_path / "other.sqlite")) as conn, pytest.raises(sqlite3.Error) as err:
        conn.execute("SELECT * FROM full")
    return err.value


def test_sqlite_and_os_failures_are_classified_by_code(tmp_path: Path) -> None:
    full, other = _sqlite_full(tmp_path), _sqlite_other(tmp_path)
    assert "full" in str(other)  # the words would have misled
    assert is_out_of_space(full) and not is_out_of_space(other)
    for number in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        assert is_out_of_space(OSError(number, "any words"))
    assert not is_out_of_space(OSError(errno.EIO, "No space left on device"))
    assert not is_out_of_space(RuntimeError("disk is full"))
    assert StorageError("wrapped", cause=full).out_of_space
    assert not StorageError("wrapped", cause=other).out_of_space
    assert not StorageError("database or disk is full").out_of_space  # no cause, no guess
    assert is_out_of_space(StorageError("wrapped twice", cause=StorageError("inner", cause=full)))


def test_a_write_that_fills_the_file_is_answered_storage_full_and_nothing_is_written(tmp_path: Path) -> None:
    """The object's file may not grow (SQLite's page cap standing in for a full disk): the
    append is refused LIMIT_EXCEEDED with STORAGE_FULL; a small one after it still fits."""

    async def scenario() -> tuple[BaseException, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            small = '{"id":"m0","role":"user","parts":[]}'
            await service.append_many("k", "", [AppendInput(small, Parent.auto(), True)])
            async with service.object("k") as store:
                pages = store._writer.execute("PRAGMA page_count").fetchone()[0]
                store._writer.execute(f"PRAGMA max_page_count = {pages + 2}")
            big = '{"id":"big","role":"user","parts":[{"type":"text","text":"' + "x" * 2_000_000 + '"}]}'
            with pytest.raises((LimitExceeded, StorageFailure)) as refused:
                await service.append_many("k", "", [AppendInput(big, Parent.auto(), True)])
            stored = [row.info.id async for window in service.history("k", "") for row in window if row.info]
            return refused.value, stored
        finally:
            await service.registry.close_all()

    refused, stored = asyncio.run(scenario())
    assert isinstance(refused, LimitExceeded) and refused.reason == "STORAGE_FULL", refused
    assert "free disk space" in refused.message
    assert stored == ["m0"]


def test_appends_grouped_with_one_that_fills_the_file_are_stored_in_order(tmp_path: Path) -> None:
    """Through the domain: appends made together while the file may not grow much. The one too
    large for the room is refused STORAGE_FULL; the others are stored, chained in the order made."""

    def text(message_id: str, size: int) -> str:
        return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{"x" * size}"}}]}}'

    async def scenario() -> tuple[list[object], list[tuple[str, str | None]]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append_many("k", "", [AppendInput(text("m0", 10), Parent.auto(), True)])
            async with service.object("k") as store:
                pages = store._writer.execute("PRAGMA page_count").fetchone()[0]
                store._writer.execute(f"PRAGMA max_page_count = {pages + 4}")
            outcomes = await asyncio.gather(
                *(
                    service.append_many("k", "", [AppendInput(text(message_id, size), Parent.auto(), True)])
                    for message_id, size in (("m1", 10), ("big", 2_000_000), ("m2", 10))
                ),
                return_exceptions=True,
            )
            stored = [
                (row.info.id, row.info.parent_id)
                async for window in service.history("k", "")
                for row in window
                if row.info
            ]
            return outcomes, stored
        finally:
            await service.registry.close_all()

    outcomes, stored = asyncio.run(scenario())
    refused = outcomes[1]
    assert isinstance(refused, LimitExceeded) and refused.reason == "STORAGE_FULL", outcomes
    small = [outcomes[0], outcomes[2]]
    assert all(isinstance(result, list) and result[0].inserted for result in small), outcomes
    assert stored == [("m0", None), ("m1", "m0"), ("m2", "m1")]
