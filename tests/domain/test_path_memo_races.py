"""A read that races a change must not leave its older snapshot remembered as the session's path.

Runs the domain over real object files (no gRPC). A read's walk is held, on its reader thread,
after its snapshot began and before it walks, while a delete commits and is forgotten; then the
walk goes on. What it walked is of the snapshot before the delete: it must not be remembered.
Before, the read took the session's version only then, after the delete's, and its walk was
kept; the next append extended it, and every later read returned the deleted message again.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import history as history_module
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

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert proceed.wait(timeout=30), "the walk was never let go"
        return original(*args, **kwargs)

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


def _texts(views: list[Any]) -> list[str]:
    return [json.loads(view.json)["parts"][0]["text"] for view in views]


def test_a_read_racing_an_update_leaves_no_stale_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An update restates the remembered path and messages in place (it forgets nothing): a read
    that read the message before the update must still not remember what it read."""
    entered, proceed = threading.Event(), threading.Event()
    original = history_module.views_by_id

    def held(*args: Any) -> Any:
        found = original(*args)  # c3 as first written
        entered.set()
        assert proceed.wait(timeout=30), "the read was never let go"
        return found

    async def history(service: SessionsService) -> list[Any]:
        return [view async for window in service.history("k", "") for view in window]

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        executor = ThreadPoolExecutor(max_workers=4)
        registry = ObjectRegistry(tmp_path, executor, calls_in_flight=lambda: 5)  # reads on threads
        service = SessionsService(registry)
        try:
            await service.append_many("k", "", [AppendInput(_message(f"c{i}"), Parent.auto(), True) for i in range(6)])
            monkeypatch.setattr(history_module, "views_by_id", held)
            racing = asyncio.ensure_future(history(service))
            await asyncio.to_thread(entered.wait, 30)
            changed = '{"id":"c3","role":"user","parts":[{"type":"text","text":"changed"}]}'
            assert (await service.update("k", "", changed, from_client=True)).changed
            proceed.set()
            raced = _texts(await racing)
            monkeypatch.setattr(history_module, "views_by_id", original)
            later = _texts(await history(service))
            await service.append_many("k", "", [AppendInput(_message("c6"), Parent.auto(), True)])
            return raced, later, _texts(await history(service))
        finally:
            await registry.close_all()
            executor.shutdown()

    raced, later, extended = asyncio.run(scenario())
    assert raced == ["c0", "c1", "c2", "c3", "c4", "c5"]
    assert later == ["c0", "c1", "c2", "changed", "c4", "c5"]
    assert extended == [*later, "c6"]
