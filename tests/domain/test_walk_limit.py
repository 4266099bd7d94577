"""A newest-first walk with a limit (StreamHistory `max_messages`) reads only the rows it returns;
the domain over real object files, no gRPC."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import paths
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import queries
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def test_a_limited_newest_first_walk_reads_only_the_rows_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a limit a reader that stops early has read ahead; with one the walk's reads take
    no more rows than the messages still wanted (a fresh service: nothing remembered, so it walks)."""
    texts = [f'{{"id":"m{i:03d}","role":"user","parts":[{{"type":"text","text":"{i}"}}]}}' for i in range(200)]

    async def write() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        await service.append_many("walk", "", [AppendInput(t, Parent.auto(), True) for t in texts])
        await service.registry.close_all()

    asyncio.run(write())
    monkeypatch.setattr(paths, "_paths", type(paths._paths)())  # nothing remembered from the write
    rows_read: list[str] = []
    get_message = queries.get_message

    def counted(conn: Any, session_id: str, message_id: str) -> Any:
        rows_read.append(message_id)
        return get_message(conn, session_id, message_id)

    monkeypatch.setattr(queries, "get_message", counted)

    async def read(limit: int) -> list[str]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            got = [
                view.info.id
                async for window in service.history("walk", "", newest_first=True, limit=limit)
                for view in window
                if view.info is not None
            ]
        finally:
            await service.registry.close_all()
        return got

    got = asyncio.run(read(10))
    assert got == [f"m{i:03d}" for i in range(199, 189, -1)]
    assert rows_read == got
