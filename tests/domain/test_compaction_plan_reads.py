"""Planning a compaction holds what planning needs of each message, not the messages: the span's
messages are read again and rendered into the prompt as they come, and a prompt past the
caller's bound is refused as soon as its messages are past it.

Before, the whole history was parsed and kept while the whole prompt was built, and
PlanCompaction refused a prompt over a response only then: 10,000 messages of 1 KB peaked at
53 MB of Python objects for a refusal, 2,000 of 10 KB at 112 MB. The domain over real object
files, no gRPC; `tracemalloc` measures what planning allocates.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import compaction, paths
from sessions_server.domain.compactor import Compactor
from sessions_server.domain.errors import LimitExceeded
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent

KEY = "o"


def _message(index: int, size: int) -> str:
    text = f"message {index} " + " ".join(f"w{index}x{word}" for word in range(size // 10))
    role = "user" if index % 2 else "assistant"
    return json.dumps({"id": f"m{index}", "role": role, "parts": [{"type": "text", "text": text}]})


def _run(tmp_path: Path, count: int, size: int, scenario: Callable[[SessionsService], Awaitable[None]]) -> None:
    async def main() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            for start in range(0, count, 100):
                items = [AppendInput(_message(i, size), Parent.auto(), True) for i in range(start, start + 100)]
                await service.append_many(KEY, "", items)
            await scenario(service)
        finally:
            await service.registry.close_all()

    asyncio.run(main())


def _count_renderings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the messages rendered into prompts, in order, from now on."""
    rendered: list[str] = []
    original = compaction.render_message

    def counted(message: Any) -> str:
        rendered.append(str(message.get("id")))
        return original(message)

    monkeypatch.setattr(compaction, "render_message", counted)
    return rendered


@pytest.fixture
def no_remembered_messages() -> Any:
    """Reads remember no messages (they would count as planning's allocations)."""
    before = paths.MAX_VIEW_BYTES
    paths.set_message_budget(0)
    yield
    paths.set_message_budget(before)


def test_a_prompt_past_its_bound_is_refused_before_the_span_is_rendered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_remembered_messages: Any
) -> None:
    rendered = _count_renderings(monkeypatch)

    async def scenario(service: SessionsService) -> None:
        tracemalloc.start()
        try:
            with pytest.raises(LimitExceeded) as refused:
                await service.compactor.plan(KEY, "", keep_recent_tokens=1, max_prompt_bytes=200_000)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert refused.value.metadata == {"limit": "max_response_bytes", "limit_value": "200000"}
        assert "AddCompaction" in refused.value.message
        # The span is m3..m397 (100 KB each): only the messages up to the bound were rendered.
        assert rendered == [f"m{index}" for index in range(3, 3 + len(rendered))]
        assert len(rendered) == 3
        # One window of messages at a time (4 MiB at most), not the 40 MB history.
        assert peak < 12_000_000, peak

    _run(tmp_path, 400, 100_000, scenario)


def test_a_prompt_within_its_bound_is_planned_from_one_rendering_of_the_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = _count_renderings(monkeypatch)

    async def scenario(service: SessionsService) -> None:
        plan = await service.compactor.plan(KEY, "", keep_recent_tokens=1, max_prompt_bytes=3 * 1024 * 1024)
        assert plan is not None
        assert (plan.from_message_id, plan.to_message_id) == ("m3", "m197")
        assert rendered == [f"m{index}" for index in range(3, 198)]
        for index in (3, 100, 197):
            assert json.loads(_message(index, 1_000))["parts"][0]["text"] in plan.prompt
        assert "message 2 " not in plan.prompt and "message 198 " not in plan.prompt

    _run(tmp_path, 200, 1_000, scenario)


def test_a_span_changed_between_the_reads_is_planned_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = Compactor._render_span
    calls: list[int] = []

    async def deleting_first(self: Compactor, object_key: str, session_id: str, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # between the planning read and the rendering read
            assert await self._service.delete(object_key, session_id, ["m50"]) == 1
        return await original(self, object_key, session_id, *args)

    monkeypatch.setattr(Compactor, "_render_span", deleting_first)

    async def scenario(service: SessionsService) -> None:
        plan = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        assert plan is not None and len(calls) == 2
        assert "message 50 " not in plan.prompt
        assert "message 49 " in plan.prompt and "message 51 " in plan.prompt

    _run(tmp_path, 100, 200, scenario)


def test_an_update_between_the_reads_is_planned_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An update moves no message, so the second read finds every id where the first did: the
    plan (span and budget from the first read) would be joined to the second read's text."""
    original = Compactor._render_span
    calls: list[int] = []

    async def updating_first(self: Compactor, object_key: str, session_id: str, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            longer = {"id": "m50", "role": "user", "parts": [{"type": "text", "text": "rewritten " * 5_000}]}
            assert (await self._service.update(object_key, session_id, json.dumps(longer), from_client=True)).changed
        return await original(self, object_key, session_id, *args)

    async def scenario(service: SessionsService) -> None:
        monkeypatch.setattr(Compactor, "_render_span", updating_first)
        raced = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        monkeypatch.setattr(Compactor, "_render_span", original)
        fresh = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        assert raced == fresh and len(calls) == 2
        assert raced is not None and "rewritten rewritten" in raced.prompt

    _run(tmp_path, 100, 200, scenario)
