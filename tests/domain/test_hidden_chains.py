"""Branches below a chain of hidden overlay rows deeper than Python's stack (1,000 frames): each
hidden child is replaced by its own children, so the visible message at the bottom is the
branch. The expansion recursed once per hidden row and failed (INTERNAL) past the stack's
depth; it goes level by level now. The domain over real object files, no gRPC."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry

CHAIN = 1_500


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]})


def test_branches_below_a_chain_of_hidden_rows_deeper_than_the_stack(tmp_path: Path) -> None:
    async def run() -> tuple[list[str], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            records = [await service.compactor.add("o", "", "summary", "x", "y") for _ in range(CHAIN)]
            hidden = [f"compaction_{record.id}" for record in records]
            async with service.importer("o", "") as importer:
                await importer.add(_message("root"), None, 1)
                parent = "root"
                for message_id in hidden:
                    await importer.add(_message(message_id), parent, 1)
                    parent = message_id
                await importer.add(_message("bottom"), parent, 1)
                await importer.add(_message("beside"), "root", 1)
            below_root = [
                view.info.id async for window in service.get_branches("o", "", "root") for view in window if view.info
            ]
            below_middle = [
                view.info.id
                async for window in service.get_branches("o", "", hidden[CHAIN // 2])
                for view in window
                if view.info
            ]
            return below_root, below_middle
        finally:
            await service.registry.close_all()

    below_root, below_middle = asyncio.run(run())
    assert below_root == ["bottom", "beside"]  # seq order: the chain's bottom was imported first
    assert below_middle == ["bottom"]
