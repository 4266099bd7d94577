"""An import stops at a failed write: nothing after it is stored. An import's messages go to the
writer in chunks, and those that arrive while a chunk is being written wait for it; when that
write failed, they were written anyway (the next chunk was sent when the failed one finished,
or at the end of the call), leaving a gap whose later messages name parents never stored,
where the contract says a failed call keeps what committed before the failure. The domain over
real object files, no gRPC; the failure is a storage error raised inside the first chunk's
write."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import imports
from sessions_server.domain.errors import SessionsError
from sessions_server.domain.service import SessionsService
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent, StorageError


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]})


def test_messages_queued_behind_a_failed_write_are_not_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = imports.import_all_in
    release = threading.Event()
    calls = 0

    def first_fails(ctx: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            release.wait(timeout=30)  # until the later messages wait behind this write
            raise StorageError("disk I/O error")
        return written(ctx, *args)

    monkeypatch.setattr(imports, "import_all_in", first_fails)

    async def run() -> tuple[str, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("m0"), None, 1)  # written at once: the write that fails
                    for index in range(1, 6):
                        await importer.add(_message(f"m{index}"), f"m{index - 1}", 1)
                    release.set()
            stored = [f"m{index}" for index in range(6) if await service.get_message("o", "", f"m{index}")]
            return failure.value.reason, stored
        finally:
            await service.registry.close_all()

    reason, stored = asyncio.run(run())
    assert reason == "STORAGE_FAILURE"
    assert stored == []


def test_an_import_whose_written_messages_were_deleted_meanwhile_stops(tmp_path: Path) -> None:
    async def run() -> tuple[str, str, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("m0"), None, 1)
                    await asyncio.wait(importer._pending)  # m0 is stored
                    assert await service.delete("o", "", ["m0"]) == 1
                    await importer.add(_message("m1"), "m0", 1)
            stored = [f"m{index}" for index in range(2) if await service.get_message("o", "", f"m{index}")]
            return failure.value.reason, failure.value.message, stored
        finally:
            await service.registry.close_all()

    reason, message, stored = asyncio.run(run())
    assert reason == "FAILED_PRECONDITION"
    # It said "1 messages in" of an import none of whose messages stayed: the words say why.
    assert message == (
        "messages this import had written were deleted or cleared by another call meanwhile; it stopped there, "
        "after 1 messages (some of which that call may have removed): send the import again to write the rest "
        "(ids stored are skipped)"
    )
    assert stored == []


def _stored(service: SessionsService, ids: list[str]) -> Any:
    async def stored() -> list[str]:
        return [message_id for message_id in ids if await service.get_message("o", "", message_id)]

    return stored()


@pytest.mark.parametrize("written_again", [False, True])
def test_an_import_stops_when_a_message_it_wrote_chunks_before_is_deleted(tmp_path: Path, written_again: bool) -> None:
    """Only the chunk written just before was checked: a message deleted from an earlier chunk
    went unseen, and the next messages were stored under it, gone (or under another call's
    message of the same id, written since), the import answered OK."""

    async def run() -> tuple[str, list[str], str | None]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("a"), None, 1)
                    await asyncio.wait(importer._pending)
                    await importer.add(_message("b"), "a", 1)
                    await asyncio.wait(importer._pending)  # a and b stored, in chunks of their own
                    assert await service.delete("o", "", ["a"]) == 1
                    if written_again:  # another call's message, under the same id
                        await service.append("o", "", _message("a"), Parent.auto(), from_client=True)
                    await importer.add(_message("c"), "a", 1)
            parent = await service.get_message("o", "", "a")
            return failure.value.reason, await _stored(service, ["a", "b", "c"]), parent and parent.info.parent_id
        finally:
            await service.registry.close_all()

    reason, stored, parent_of_a = asyncio.run(run())
    assert reason == "FAILED_PRECONDITION"
    assert stored == (["a", "b"] if written_again else ["b"])
    assert parent_of_a == ("b" if written_again else None)  # the other call's a, appended after b


@pytest.mark.parametrize("parent", ["a", None])
def test_a_chunk_queued_behind_one_that_stopped_the_import_writes_nothing(tmp_path: Path, parent: str | None) -> None:
    """The stopping chunk here holds only an id stored before (skipped, as in an import sent
    again); the chunk queued behind it found that id stored and wrote its messages, after the
    import had answered that it stopped before them."""

    async def run() -> tuple[str, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append("o", "", _message("p"), Parent.auto(), from_client=True)
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("a"), "p", 1)
                    await asyncio.wait(importer._pending)
                    assert await service.delete("o", "", ["a"]) == 1
                    other = sqlite3.connect(object_path(tmp_path, "o"), isolation_level=None, timeout=0)
                    try:
                        other.execute("BEGIN IMMEDIATE")  # the next chunks wait for the file's lock
                        await importer.add(_message("p"), None, 1)  # stored already: skipped
                        queued = [f"c{index}" for index in range(imports.IMPORT_CHUNK_MESSAGES)]
                        for message_id in queued:  # a chunk of its own, queued behind that one
                            await importer.add(_message(message_id), parent, 1)
                        assert len(importer._pending) == 2
                    finally:
                        other.close()
            return failure.value.reason, await _stored(service, ["a", "p", "c0", "c63"])
        finally:
            await service.registry.close_all()

    reason, stored = asyncio.run(run())
    assert reason == "FAILED_PRECONDITION"
    assert stored == ["p"]


def test_a_message_the_import_only_skipped_may_be_deleted_meanwhile(tmp_path: Path) -> None:
    """An id stored before the import is skipped, not written by it: another call deleting it
    stopped the import as if its own messages had been removed."""

    async def run() -> tuple[int, int, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append("o", "", _message("p"), Parent.auto(), from_client=True)
            async with service.importer("o", "") as importer:
                await importer.add(_message("p"), None, 1)  # stored already: skipped
                await asyncio.wait(importer._pending)
                assert await service.delete("o", "", ["p"]) == 1
                await importer.add(_message("q"), None, 1)
            return importer.imported, importer.skipped, await _stored(service, ["p", "q"])
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == (1, 1, ["q"])


@pytest.mark.parametrize("removal", ["clear", "delete"])
def test_an_import_stops_after_a_clear_when_the_chunk_before_only_skipped(tmp_path: Path, removal: str) -> None:
    """Only the chunk just before was checked: when it had only skipped ids stored before the
    import, and the next messages were roots, they were written after a clear (or a delete) of
    what the import had written, and the import answered OK, its first messages gone."""

    async def run() -> tuple[str, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append("o", "", _message("p"), Parent.auto(), from_client=True)
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("a"), None, 1)
                    await asyncio.wait(importer._pending)  # a written, in a chunk of its own
                    await importer.add(_message("p"), None, 1)
                    await asyncio.wait(importer._pending)  # p stored already: skipped, a chunk of its own
                    if removal == "clear":
                        assert await service.clear("o", "") == 2
                    else:
                        assert await service.delete("o", "", ["a"]) == 1
                    await importer.add(_message("q"), None, 1)
            return failure.value.reason, await _stored(service, ["a", "p", "q"])
        finally:
            await service.registry.close_all()

    reason, stored = asyncio.run(run())
    assert reason == "FAILED_PRECONDITION"
    assert stored == ([] if removal == "clear" else ["p"])


def test_a_chunk_run_again_after_its_group_commit_failed_is_written(tmp_path: Path) -> None:
    """A group whose COMMIT fails runs each write again alone. An import's chunk had noted the
    messages of its first run as written: run again, it found its own parent (written earlier
    in that chunk, rolled back since) gone, and stopped as if another call had deleted it."""
    chain = [f"m{index}" for index in range(imports.IMPORT_CHUNK_MESSAGES)]

    async def run() -> tuple[list[Any], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append("o", "", _message("seed"), Parent.auto(), from_client=True)
            async with service.importer("o", "") as importer:
                await importer.add(_message("x"), None, 1)
                await asyncio.wait(importer._pending)
                store = importer._store
                assert store is not None
                # A write that breaks a deferred foreign key fails its group's COMMIT, as a
                # full disk does when the WAL cannot grow.
                for statement in (
                    "CREATE TABLE owner (name TEXT PRIMARY KEY)",
                    "CREATE TABLE owned (name TEXT REFERENCES owner (name) DEFERRABLE INITIALLY DEFERRED)",
                    "PRAGMA foreign_keys = ON",
                ):
                    store._writer.execute(statement)
                other = sqlite3.connect(object_path(tmp_path, "o"), isolation_level=None, timeout=0)
                try:
                    other.execute("BEGIN IMMEDIATE")  # what follows queues, then runs as one group
                    await importer.add(_message("y"), "x", 1)  # its write takes the lock's wait alone
                    for index, message_id in enumerate(chain):  # a chunk of its own
                        await importer.add(_message(message_id), chain[index - 1] if index else "y", 1)
                    orphan = asyncio.ensure_future(
                        store.write(lambda ctx: ctx.conn.execute("INSERT INTO owned VALUES ('nobody')"))
                    )
                    assert len(importer._pending) == 2
                finally:
                    other.close()
                outcomes = await asyncio.gather(orphan, return_exceptions=True)
            return outcomes, await _stored(service, ["x", "y", "m0", "m1", chain[-1]])
        finally:
            await service.registry.close_all()

    outcomes, stored = asyncio.run(run())
    assert isinstance(outcomes[0], StorageError) and "commit failed" in str(outcomes[0]), outcomes
    assert stored == ["x", "y", "m0", "m1", chain[-1]]
