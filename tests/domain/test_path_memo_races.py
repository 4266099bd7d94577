"""A read that races a change must not leave its older snapshot remembered as the session's path.

Runs the domain over real object files (no gRPC). A read's walk is held, on its reader thread,
after its snapshot began and before it walks, while a delete commits and is forgotten; then the
walk goes on. What it walked is of the snapshot before the delete: it must not be remembered.
Before, the read took the session's version only then, after the delete's, and its walk was
kept; the next append extended it, and every later read returned the deleted message again.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import paths
from sessions_server.domain import service as service_module
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def _message(message_id: str) -> str:
    return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{message_id}"}}]}}'


@pytest.mark.parametrize("read", ["history", "row_stats"])
def test_a_read_racing_a_delete_leaves_no_stale_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    entered, proceed = threading.Event(), threading.Event()
    original = paths.path_stats

    def held(*args: Any) -> Any:
        entered.set()
        assert proceed.wait(timeout=30), "the walk was never let go"
        return original(*args)

    async def ids(service: SessionsService) -> list[str]:
        if read == "history":
            return [view.info.id async for window in service.history("k", "") for view in window]
        return [row.id for row in await service.row_stats("k", "")]

    async def scenario() -> tuple[list[str], list[str]]:
        executor = ThreadPoolExecutor(max_workers=4)
        registry = ObjectRegistry(tmp_path, executor, calls_in_flight=lambda: 5)  # reads on threads
        service = SessionsService(registry)
        try:
            await service.append_many("k", "", [AppendInput(_message(f"c{i}"), Parent.auto(), True) for i in range(6)])
            monkeypatch.setattr(service_module.paths, "path_stats", held)
            racing = asyncio.ensure_future(ids(service))
            await asyncio.to_thread(entered.wait, 30)  # its snapshot holds c3
            assert await service.delete("k", "", ["c3"]) == 1
            proceed.set()
            raced = await racing
            monkeypatch.setattr(service_module.paths, "path_stats", original)
            await service.append_many("k", "", [AppendInput(_message("c3"), Parent.auto(), True)])
            return raced, await ids(service)
        finally:
            await registry.close_all()
            executor.shutdown()

    raced, later = asyncio.run(scenario())
    assert raced in (["c0", "c1", "c2", "c3", "c4", "c5"], ["c0", "c1", "c2", "c4", "c5"])
    assert later == ["c0", "c1", "c2", "c4", "c5", "c3"]
