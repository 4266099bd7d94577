"""Branches below a chain of hidden overlay rows deeper than Python's stack (1,000 frames): each
hidden child is replaced by its own children, so the visible message at the bottom is the
branch. The expansion recursed once per hidden row and failed (INTERNAL) past the stack's
depth; it goes level by level now. The domain over real object files, no gRPC."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain.service import SessionsService
from sessions_server.storage import queries
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


def test_latest_leaf_and_branches_read_no_compaction_summaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """They only skip hidden rows, which takes the records' ids: reading every record whole took
    133 ms at 50 summaries of 1 MiB (upstream: 4 ms, looking up the candidate ids)."""

    async def run() -> tuple[str | None, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            first, second = [await service.compactor.add("o", "", "summary " * 1000, "x", "y") for _ in range(2)]
            async with service.importer("o", "") as importer:
                await importer.add(_message("root"), None, 1)
                await importer.add(_message(f"compaction_{first.id}"), "root", 1)
                await importer.add(_message("child"), f"compaction_{first.id}", 1)
                await importer.add(_message(f"compaction_{second.id}"), "child", 1)  # the newest row: hidden
            for reads_summaries in ("compaction_summary", "compactions_after"):
                monkeypatch.setattr(queries, reads_summaries, _no_summaries)
            leaf = await service.get_latest_leaf("o", "")
            below = [
                view.info.id async for window in service.get_branches("o", "", "root") for view in window if view.info
            ]
            return (leaf.info.id if leaf and leaf.info else None), below
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == ("child", ["child"])


def _no_summaries(*args: object) -> list[object]:
    raise AssertionError("read a compaction record's summary")
