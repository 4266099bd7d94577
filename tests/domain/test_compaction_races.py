"""`Compact` plans again when the session changes (other than by appends) while it summarizes,
also when the change was under way, counted but not committed, as the plan began.

Runs the domain over real object files (no gRPC). A delete's write job is held on the writer's
thread after it counted its change and before its commit; a compaction plans meanwhile (its
snapshot still has the deleted message) and asks the summarizer, which lets the delete commit
before answering. The change was counted inside the job, so the plan took the count with the
delete in it, and the record summarizing the deleted message was stored.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import service as service_module
from sessions_server.domain.compactor import Policy
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from sessions_server.storage.store import WriteContext


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": f"text-{message_id}"}]})


def test_a_change_committed_while_compact_summarizes_makes_it_plan_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted, proceed = threading.Event(), threading.Event()
    original = service_module.note_session_changed
    prompts: list[str] = []

    def held(ctx: WriteContext, session_id: str) -> None:
        original(ctx, session_id)
        counted.set()
        assert proceed.wait(timeout=30), "the delete was never let go"

    async def scenario() -> tuple[str, list[str]]:
        deleting: asyncio.Future[int] | None = None

        class Echo:
            """Summarizes by naming the texts it was given; lets the delete commit first."""

            async def summarize(self, prompt: str) -> str:
                prompts.append(prompt)
                if deleting is not None and not deleting.done():
                    proceed.set()
                    await deleting
                return "S:" + ",".join(re.findall(r"text-m\d+", prompt.split("Use this structure")[0]))

        executor = ThreadPoolExecutor(max_workers=4)
        registry = ObjectRegistry(tmp_path, executor, calls_in_flight=lambda: 5)  # jobs on threads
        service = SessionsService(registry, summarizer=Echo())
        try:
            await service.append_many("k", "", [AppendInput(_message(f"m{i}"), Parent.auto(), True) for i in range(12)])
            await service.compactor.set_policy("k", "", Policy(0, 1))
            monkeypatch.setattr(service_module, "note_session_changed", held)
            deleting = asyncio.ensure_future(service.delete("k", "", ["m5"]))
            await asyncio.to_thread(counted.wait, 30)  # counted, not committed
            monkeypatch.setattr(service_module, "note_session_changed", original)
            record = await service.compactor.compact("k", "")
            assert record is not None
            assert await deleting == 1
            return record.summary, prompts
        finally:
            proceed.set()
            await registry.close_all()
            executor.shutdown()

    summary, asked = asyncio.run(scenario())
    assert "text-m5" in asked[0]  # the first plan still had it: its summary was made again
    assert len(asked) == 2
    assert "text-m4" in summary and "text-m5" not in summary
