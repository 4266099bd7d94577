"""GetMessages and GetBranches read in windows bounded by stored bytes, as history reads do: a
window is at most 50 rows and 4 MiB (a larger message alone), sized before it is read. Both read
every row of a list (50 ids; every child) in one read: 50 messages of 20 MB held 2 GB at once,
and a parent of 5,000 children of 100 KB held 1 GB before the first answer. The domain over real
object files."""

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
