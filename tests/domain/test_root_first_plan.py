"""A lone caller's root-first history read runs on the event loop's thread: its plan (the leaf,
the session's compaction records, the remembered rows, or a walk when the path is not
remembered, stopped and run again on the executor if it outlasts a quick read) and its windows
of messages of up to 1 MiB stored each. Before, each took the hop to a worker thread, and on a
freshly opened object a second connection: most of the cost of reading a few messages; a long
session's windows past its first (50 rows and 256 KiB) took it too. Larger windows take the
executor. The domain over a real object file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.messages import is_overlay_id
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import store as store_module
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from sessions_server.storage.store import ObjectStore


def _message(message_id: str, padding: int = 0) -> str:
    text = message_id + " " + "x" * padding
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})


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


async def _append(service: SessionsService, *ids: str, padding: int = 0) -> None:
    await service.append_many("o", "s", [AppendInput(_message(i, padding), Parent.auto(), True) for i in ids])


@pytest.mark.parametrize("compacted", [False, True], ids=["plain", "with a compaction record"])
def test_a_short_sessions_reads_run_in_place(tmp_path: Path, executor_reads: list[str], compacted: bool) -> None:
    async def run() -> tuple[list[str], list[str]]:
        await _appended(tmp_path, compacted, "m1", "m2", "m3")
        service = _service(tmp_path)  # the object closed and opened again: nothing remembered
        try:
            first = await _ids(service)  # walks, and remembers the path and its messages
            await _append(service, "m4")  # extends what is remembered
            return first, await _ids(service)
        finally:
            await service.registry.close_all()

    first, second = asyncio.run(run())
    assert executor_reads == []
    if compacted:  # m1 and m2 read as the record's overlay
        assert len(first) == 2 and is_overlay_id(first[0]) and first[1] == "m3"
    else:
        assert first == ["m1", "m2", "m3"]
    assert second == [*first, "m4"]


def test_a_long_sessions_windows_of_small_messages_run_in_place(tmp_path: Path, executor_reads: list[str]) -> None:
    ids = [f"m{index:03d}" for index in range(300)]

    async def run() -> list[str]:
        await _appended(tmp_path, False, *ids, padding=1_000)
        service = _service(tmp_path)
        try:
            return await _ids(service)  # windows of 50, 100 and 150 rows
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == ids
    assert executor_reads == []


def test_a_window_of_large_messages_is_read_on_the_executor(tmp_path: Path, executor_reads: list[str]) -> None:
    async def run() -> list[str]:
        await _appended(tmp_path, False, "m1", "m2", "m3", "m4", padding=300_000)
        service = _service(tmp_path)
        try:
            return await _ids(service)
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == ["m1", "m2", "m3", "m4"]
    # The plan with its first window (1.2 MB stored), one snapshot: begun in place, it stops at
    # the window and runs again on the executor.
    assert len(executor_reads) == 1


def _service(data_dir: Path) -> SessionsService:
    return SessionsService(ObjectRegistry(data_dir, ThreadPoolExecutor(max_workers=2), calls_in_flight=lambda: 1))


async def _appended(data_dir: Path, compacted: bool, *ids: str, padding: int = 0) -> None:
    service = _service(data_dir)
    try:
        await _append(service, *ids, padding=padding)
        if compacted:
            await service.compactor.add("o", "s", "summary of one and two", ids[0], ids[1])
    finally:
        await service.registry.close_all()
