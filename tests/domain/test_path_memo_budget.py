"""The path memo stays within its process-wide row budget, and what it serves stays right.

Runs the domain over real object files (no gRPC): several sessions read in turn under a small
budget, so remembered paths are dropped least recently used first and walked again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import paths
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def _message(message_id: str) -> str:
    return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{message_id}"}}]}}'


def _accounted() -> int:
    return sum(len(path.rows) for path in paths._paths.values())


def test_remembered_rows_stay_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "MAX_REMEMBERED_ROWS", 250)
    monkeypatch.setattr(paths, "_paths", OrderedDict())  # what other tests left is not ours to count
    monkeypatch.setattr(paths, "_rows", 0)
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))

    async def history_ids(session_id: str) -> list[str]:
        return [view.info.id async for window in service.history("budget", session_id) for view in window]

    async def scenario() -> None:
        expected: dict[str, list[str]] = {}
        for index in range(4):  # 4 sessions of 100 rows: at most two fit in the budget
            session_id = f"s{index}"
            ids = [f"{session_id}-{n:03d}" for n in range(100)]
            items = [AppendInput(_message(i), Parent.auto(), True) for i in ids]
            await service.append_many("budget", session_id, items)
            expected[session_id] = ids
        for round_ in range(3):
            for session_id, ids in expected.items():
                assert await history_ids(session_id) == ids
                assert paths._rows == _accounted() <= paths.MAX_REMEMBERED_ROWS
                new_id = f"{session_id}-x{round_}"
                await service.append("budget", session_id, _message(new_id), Parent.auto(), from_client=True)
                ids.append(new_id)  # extends the remembered path when it is still held
                assert paths._rows == _accounted() <= paths.MAX_REMEMBERED_ROWS
        assert 0 < len(paths._paths) <= 2

    asyncio.run(scenario())
