"""A root-first history read of a remembered path (an agent's read after its own append) plans
in point reads on the event loop's thread for a lone caller: the leaf, the session's compaction
records and the remembered rows. Before, the plan always took the hop to a worker thread, in a
read of a few messages most of the read's cost. A path that is not remembered is still walked
on the executor. The domain over a real object file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import store as store_module
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from sessions_server.storage.store import ObjectStore


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]})


@pytest.fixture
def executor_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The reads that ran on the executor, by the name of the function they ran."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)  # however slowly this machine reads
    names: list[str] = []
    read_blocking = ObjectStore._read_blocking

    def recorded(store: ObjectStore, run: Callable[[Any], Any], *args: Any) -> Any:
        names.append(getattr(run, "__name__", "?"))
        return read_blocking(store, run, *args)

    monkeypatch.setattr(ObjectStore, "_read_blocking", recorded)
    return names


async def _ids(service: SessionsService) -> list[str]:
    return [json.loads(view.json)["id"] async for window in service.history("o", "s") for view in window]


async def _append(service: SessionsService, *ids: str) -> None:
    await service.append_many("o", "s", [AppendInput(_message(i), Parent.auto(), True) for i in ids])


@pytest.mark.parametrize("compacted", [False, True], ids=["plain", "with a compaction record"])
def test_a_remembered_path_is_planned_in_place(tmp_path: Path, executor_reads: list[str], compacted: bool) -> None:
    async def run() -> tuple[list[str], list[str], list[str]]:
        service = SessionsService(
            ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2), calls_in_flight=lambda: 1)
        )
        try:
            await _append(service, "m1", "m2", "m3")
            if compacted:
                await service.compactor.add("o", "s", "summary of one and two", "m1", "m2")
            first = await _ids(service)  # walks, and remembers the path and its messages
            walked = list(executor_reads)
            executor_reads.clear()
            await _append(service, "m4")  # extends what is remembered
            return first, await _ids(service), walked
        finally:
            await service.registry.close_all()

    first, second, walked = asyncio.run(run())
    assert walked  # not remembered yet: the walk (and the messages' read) took the executor
    assert executor_reads == []  # the plan, in place; the messages, remembered
    expected = ["m1", "m2", "m3"] if not compacted else [first[0], "m3"]
    assert first == expected
    assert second == [*expected, "m4"]
