"""GetMessages, GetBranches and newest-first history read in windows bounded by stored bytes, as
root-first history reads do: a window is at most 4 MiB (a larger message alone), sized before it
is read. GetMessages and GetBranches read every row of a list (50 ids; every child) in one read:
50 messages of 20 MB held 2 GB at once, and a parent of 5,000 children of 100 KB held 1 GB before
the first answer; a newest-first walk read up to 64 rows at once, whatever they weighed. The
domain over real object files."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.history import WINDOW_BYTES
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent

MESSAGE_BYTES = 1_500_000  # two to a window: three would pass WINDOW_BYTES


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": "x" * MESSAGE_BYTES}]})


def test_get_messages_and_branches_read_windows_of_at_most_4_mib(tmp_path: Path) -> None:
    ids = [f"m{index}" for index in range(7)]

    async def run() -> tuple[list[list[str]], list[list[str]]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append(
                "o", "", json.dumps({"id": "root", "role": "user", "parts": []}), Parent.auto(), from_client=True
            )
            await service.append_many("o", "", [AppendInput(_message(i), Parent.of("root"), True) for i in ids])
            by_id = [
                [v.info.id for v in window if v.info] async for window in service.get_messages("o", "", ["nope", *ids])
            ]
            children = [[v.info.id for v in window if v.info] async for window in service.get_branches("o", "", "root")]
            return by_id, children
        finally:
            await service.registry.close_all()

    by_id, children = asyncio.run(run())
    assert 2 * MESSAGE_BYTES < WINDOW_BYTES < 3 * MESSAGE_BYTES
    assert by_id == [["m0", "m1"], ["m2", "m3"], ["m4", "m5"], ["m6"]]  # an absent id costs nothing
    assert children == [["m0", "m1"], ["m2", "m3"], ["m4", "m5"], ["m6"]]


def _newest_first_windows(tmp_path: Path, compacted: tuple[str, str] | None) -> list[list[tuple[str, int]]]:
    """Writes a root and seven messages of MESSAGE_BYTES (and a compaction), then reads the
    history newest first from a fresh registry, so that the walk reads the file (nothing
    remembered): each window's (id, JSON bytes)."""
    ids = [f"m{index}" for index in range(7)]

    async def write() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            root = json.dumps({"id": "root", "role": "user", "parts": []})
            await service.append("o", "", root, Parent.auto(), from_client=True)
            await service.append_many("o", "", [AppendInput(_message(i), Parent.auto(), True) for i in ids])
            if compacted:
                await service.compactor.add("o", "", "summary", *compacted)
        finally:
            await service.registry.close_all()

    async def read() -> list[list[tuple[str, int]]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            return [
                [
                    (v.info.id if v.info and not v.info.id.startswith("compaction_") else "overlay", len(v.json))
                    for v in window
                ]
                async for window in service.history("o", "", newest_first=True)
            ]
        finally:
            await service.registry.close_all()

    asyncio.run(write())
    return asyncio.run(read())


def test_a_newest_first_walk_reads_windows_of_at_most_4_mib(tmp_path: Path) -> None:
    """The walk up the parent pointers stops a read before the row that would pass WINDOW_BYTES
    and goes on from there: before, its reads grew to 64 rows whatever they weighed."""
    windows = _newest_first_windows(tmp_path, None)
    assert [[message_id for message_id, _ in window] for window in windows] == [
        ["m6", "m5"],
        ["m4", "m3"],
        ["m2", "m1"],
        ["m0", "root"],
    ]
    assert all(sum(size for _, size in window) <= WINDOW_BYTES for window in windows)


def test_a_newest_first_read_past_a_compaction_reads_windows_of_at_most_4_mib(tmp_path: Path) -> None:
    """Past the newest row that ends a compaction, the read plans the overlays over the rest of
    the path: its windows are sized by the rows' stored bytes too (they counted 0 bytes a row)."""
    windows = _newest_first_windows(tmp_path, ("m1", "m2"))
    read = [message_id for window in windows for message_id, _ in window]
    assert read == ["m6", "m5", "m4", "m3", "overlay", "m0", "root"]
    assert all(sum(size for _, size in window) <= WINDOW_BYTES for window in windows)
    assert max(len(window) for window in windows) <= 2
