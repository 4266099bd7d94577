"""An erase is final while other work on the object is under way: nothing waiting for the object
may create it anew. An export that waited behind the erase opened with create (it had checked
for the file before waiting) and sent a new empty object, which stayed on disk and in
ListObjects; a `Compact` whose summary arrived after the erase stored its record in a new file.
The domain over real object files, no gRPC."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain.errors import NotFound
from sessions_server.domain.service import SessionsService
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def _message(message_id: str, text: str = "hello") -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})


class _HeldSummarizer:
    """Answers once let go, so that the test can erase the object while a summary is made."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def summarize(self, prompt: str) -> str:
        self.asked.set()
        await self.answer.wait()
        return "summary"


def test_an_export_waiting_behind_an_erase_finds_no_object(tmp_path: Path) -> None:
    async def run() -> tuple[bool, list[str]]:
        registry = ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2))
        service = SessionsService(registry)
        try:
            await service.append("o", "", _message("m1"), Parent.auto(), from_client=True)
            erase = asyncio.create_task(service.objects.erase("o"))
            while "o" not in registry._held:  # the erase has closed the object and holds it
                await asyncio.sleep(0)
            with pytest.raises(NotFound):
                async for _ in service.objects.export("o", lock_for_move=False, lease_seconds=0):
                    pass
            assert await erase is True
            return object_path(tmp_path, "o").exists(), (await service.objects.list_keys(0, ""))[0]
        finally:
            await registry.close_all()

    assert asyncio.run(run()) == (False, [])


def test_a_compaction_summarized_across_an_erase_stores_nothing(tmp_path: Path) -> None:
    async def run() -> tuple[object, bool, list[str]]:
        summarizer = _HeldSummarizer()
        registry = ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2))
        service = SessionsService(registry, summarizer=summarizer)
        try:
            for index in range(30):
                await service.append("o", "", _message(f"m{index}", "word " * 3000), Parent.auto(), from_client=True)
            compaction = asyncio.create_task(service.compactor.compact("o", ""))
            await summarizer.asked.wait()
            assert await service.objects.erase("o") is True
            summarizer.answer.set()
            stored = await compaction
            return stored, object_path(tmp_path, "o").exists(), (await service.objects.list_keys(0, ""))[0]
        finally:
            await registry.close_all()

    assert asyncio.run(run()) == (None, False, [])
