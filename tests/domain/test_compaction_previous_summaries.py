"""Which summaries a compaction's prompt extends: every overlay the new span hides (our documented
extension: upstream passes only the first overlay's), and no overlay the span leaves visible.

The span ends at its last raw middle message. An overlay after that message, still before the
recent tail, stays visible after the compaction: its summary was put into the prompt all the
same (audit of the forty-first session: upstream's "PREVIOUS SUMMARY:" was "FIRST", ours
"FIRST\\n\\nLATER", and LATER was then both visible and folded into the new summary). The domain
over real object files, no gRPC; the summarizer names what it was asked to extend.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent

KEY = "o"


class Recorder:
    """A summarizer that keeps its prompts and answers NEW."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def summarize(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return "NEW"


def _message(index: int) -> str:
    return json.dumps({"id": f"m{index}", "role": "user", "parts": [{"type": "text", "text": f"turn {index}"}]})


def _previous(prompt: str) -> str:
    """The prompt's PREVIOUS SUMMARY section (the update template's)."""
    assert "PREVIOUS SUMMARY:\n" in prompt, prompt
    return prompt.split("PREVIOUS SUMMARY:\n", 1)[1].split("\n\nNEW TURNS TO INCORPORATE:\n", 1)[0]


async def _ids(service: SessionsService) -> list[str]:
    return [json.loads(view.json)["id"] async for window in service.history(KEY, "") for view in window]


def _run(tmp_path: Path, count: int, scenario: Callable[[SessionsService, Recorder], Awaitable[None]]) -> None:
    async def main() -> None:
        recorder = Recorder()
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)), summarizer=recorder)
        try:
            await service.append_many(KEY, "", [AppendInput(_message(i), Parent.auto(), True) for i in range(count)])
            await scenario(service, recorder)
        finally:
            await service.registry.close_all()

    asyncio.run(main())


def test_an_overlay_after_the_spans_last_message_is_not_a_previous_summary(tmp_path: Path) -> None:
    async def scenario(service: SessionsService, recorder: Recorder) -> None:
        first = await service.compactor.add(KEY, "", "FIRST", "m3", "m4")
        later = await service.compactor.add(KEY, "", "LATER", "m7", "m7")
        overlay = {record.id: "compaction_" + record.id for record in (first, later)}
        assert await _ids(service) == ["m0", "m1", "m2", overlay[first.id], "m5", "m6", overlay[later.id], "m8", "m9"]

        plan = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m6")
        assert _previous(plan.prompt) == "FIRST"  # upstream's prompt too
        assert "LATER" not in plan.prompt

        record = await service.compactor.compact(KEY, "", keep_recent_tokens=1)
        assert record is not None and (record.from_message_id, record.to_message_id) == ("m3", "m6")
        assert recorder.prompts == [plan.prompt]
        # LATER stays visible: its summary is its own, not folded into the new one as well.
        assert await _ids(service) == ["m0", "m1", "m2", "compaction_" + record.id, overlay[later.id], "m8", "m9"]

    _run(tmp_path, 10, scenario)


def test_every_overlay_the_span_hides_is_a_previous_summary_and_no_other(tmp_path: Path) -> None:
    """FIRST starts the span, MIDDLE is inside it (both hidden: both summaries extended); LATER
    sits after its last message, before the recent tail (visible: not extended)."""

    async def scenario(service: SessionsService, recorder: Recorder) -> None:
        await service.compactor.add(KEY, "", "FIRST", "m3", "m4")
        await service.compactor.add(KEY, "", "MIDDLE", "m6", "m6")
        later = await service.compactor.add(KEY, "", "LATER", "m9", "m9")
        # m0 m1 m2 FIRST m5 MIDDLE m7 m8 LATER m10 m11

        plan = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m8")
        assert _previous(plan.prompt) == "FIRST\n\nMIDDLE"
        assert "LATER" not in plan.prompt
        assert all(f"turn {i}" in plan.prompt for i in (5, 7, 8))

        record = await service.compactor.compact(KEY, "", keep_recent_tokens=1)
        assert record is not None and recorder.prompts == [plan.prompt]
        ids = await _ids(service)
        assert ids == ["m0", "m1", "m2", "compaction_" + record.id, "compaction_" + later.id, "m10", "m11"]

    _run(tmp_path, 12, scenario)


def test_an_overlay_in_the_recent_tail_is_neither_extended_nor_a_previous_summary(tmp_path: Path) -> None:
    """The first overlay visible was extended wherever it lay: one in the recent tail began the
    span after its end, a reversed span that hid nothing (as upstream plans it), and with a
    policy set every append stored another such record and asked the summarizer again."""

    async def scenario(service: SessionsService, recorder: Recorder) -> None:
        tail = await service.compactor.add(KEY, "", "TAIL", "m10", "m10")
        plan = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m9")
        assert "TAIL" not in plan.prompt

        record = await service.compactor.compact(KEY, "", keep_recent_tokens=1)
        assert record is not None and (record.from_message_id, record.to_message_id) == ("m3", "m9")
        assert await _ids(service) == ["m0", "m1", "m2", "compaction_" + record.id, "compaction_" + tail.id, "m11"]
        assert await service.compactor.plan(KEY, "", keep_recent_tokens=1) is None  # nothing left to do

    _run(tmp_path, 12, scenario)


def test_an_overlay_between_the_spans_last_message_and_the_tail_is_not_extended(tmp_path: Path) -> None:
    async def scenario(service: SessionsService, recorder: Recorder) -> None:
        later = await service.compactor.add(KEY, "", "LATER", "m9", "m9")
        plan = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m8")
        assert "LATER" not in plan.prompt
        record = await service.compactor.compact(KEY, "", keep_recent_tokens=1)
        assert record is not None
        assert await _ids(service) == [
            "m0",
            "m1",
            "m2",
            "compaction_" + record.id,
            "compaction_" + later.id,
            "m10",
            "m11",
        ]

    _run(tmp_path, 12, scenario)
