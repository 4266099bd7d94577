"""GetMessages, GetBranches and newest-first history read in windows bounded by stored bytes, as
root-first history reads do: a window is at most 4 MiB (a larger message alone), sized before it
is read. GetMessages and GetBranches read every row of a list (50 ids; every child) in one read:
50 messages of 20 MB held 2 GB at once, and a parent of 5,000 children of 100 KB held 1 GB before
the first answer; a newest-first walk read up to 64 rows at once, whatever they weighed. The
domain over real object files."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

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


PAYLOAD = random.Random(11).randbytes(300_000)  # 400,000 bytes in base64
POINTER = "attachment:sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
USES = 8  # each message reads back as 3.2 MB: two pass WINDOW_BYTES, its stored bytes are 0.3 MB


def _naming_the_payload(message_id: str) -> str:
    parts = [{"type": "file", "mediaType": "image/png", "url": POINTER} for _ in range(USES)]
    return json.dumps({"id": message_id, "role": "user", "parts": parts})


READS: dict[str, Callable[[SessionsService], AsyncIterator[Any]]] = {
    "get_messages": lambda service: service.get_messages("o", "", [f"m{index}" for index in range(6)]),
    "branches": lambda service: service.get_branches("o", "", "img"),
    "root_first": lambda service: service.history("o", ""),
    "newest_first": lambda service: service.history("o", "", newest_first=True),
    "recent": lambda service: service.recent_history("o", "", 1 << 30),
}


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("remembered", [False, True], ids=["cold", "after_a_whole_read"])
def test_windows_end_after_the_message_whose_payloads_pass_4_mib(tmp_path: Path, read: str, remembered: bool) -> None:
    """A window is sized by stored bytes before it is read, and a payload counts once per message
    however many times the message names it: six messages naming a 0.3 MB image eight times each
    came back in one window of 19 MB. A window now ends after the message that brings what it
    read back past WINDOW_BYTES, and the read goes on from the next."""
    ids = [f"m{index}" for index in range(6)]

    async def write() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            url = "data:image/png;base64," + base64.b64encode(PAYLOAD).decode()
            image = {"id": "img", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": url}]}
            await service.append("o", "", json.dumps(image), Parent.auto(), from_client=True)
            await service.append_many("o", "", [AppendInput(_naming_the_payload(i), Parent.auto(), True) for i in ids])
            if read == "branches":  # all six the image's children
                await service.append_many(
                    "o", "", [AppendInput(_naming_the_payload(f"b{i}"), Parent.of("img"), True) for i in range(5)]
                )
        finally:
            await service.registry.close_all()

    async def windows() -> list[list[tuple[str, int]]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            if remembered:
                whole = [view async for window in service.history("o", "") for view in window]
                assert len(whole) == (2 if read == "branches" else 7)  # the image and the newest branch
            return [
                [(view.info.id if view.info else "", len(view.json)) for view in window]
                async for window in READS[read](service)
                if isinstance(window, list)
            ]
        finally:
            await service.registry.close_all()

    asyncio.run(write())
    read_windows = asyncio.run(windows())
    messages = [(message_id, size) for window in read_windows for message_id, size in window]
    expected = {"get_messages": ids, "branches": ["m0", *(f"b{i}" for i in range(5))]}.get(read)
    if expected is None:
        expected = ["img", *ids]
        if read == "newest_first":
            expected.reverse()
    assert [message_id for message_id, _ in messages] == expected
    assert all(USES * 400_000 < size < WINDOW_BYTES for message_id, size in messages if message_id != "img")
    assert all(sum(size for _, size in window[:-1]) <= WINDOW_BYTES for window in read_windows)
    assert len(read_windows) >= 3  # 19 MB read back in windows of two or three messages
