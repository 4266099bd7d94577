"""An import keeps parents as given, so a row may name a parent that is not stored. A remembered
path that stops at such a row must be walked again when a row is appended under that id: the
new row joins the path's root to its leaf (here closing a cycle, which a walk follows to its
cap, as upstream's does). Before, the memo only extended the path by the new row. The domain
over real object files."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.compactor import forget_estimate
from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import MAX_PATH_DEPTH, Parent


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]})


def test_an_append_under_the_missing_parent_of_a_remembered_path_walks_it_again(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[str], list[str], list[str], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))

        async def reads() -> tuple[list[str], list[str]]:
            history = [view.info.id async for window in service.history("k", "") for view in window]
            return history, [row.id for row in await service.row_stats("k", "")]

        try:
            async with service.importer("k", "") as importer:
                await importer.add(_message("b"), "a", 1_700_000_000_000)  # "a" is not stored
            await service.append("k", "", _message("c"), Parent.auto(), from_client=True)
            assert await reads() == (["b", "c"], ["b", "c"])  # remembered, open at "a"
            await service.append("k", "", _message("a"), Parent.auto(), from_client=True)  # a -> c -> b -> a
            remembered = await reads()
            async with service.object("k") as store:
                forget_estimate(store, "")
            return *remembered, *await reads()
        finally:
            await service.registry.close_all()

    history, stats, fresh_history, fresh_stats = asyncio.run(scenario())
    assert (history, stats) == (fresh_history, fresh_stats)
    assert len(history) == MAX_PATH_DEPTH + 1 and history[-3:] == ["b", "c", "a"]
