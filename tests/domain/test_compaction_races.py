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
from sessions_server.domain.errors import FailedPrecondition
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.feed import ChangeEvent
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


def test_a_compact_the_session_outran_every_time_says_so_and_stores_nothing(tmp_path: Path) -> None:
    """A compaction audit: while each summary was made, the newest message was updated (a reply
    streaming in); after three summaries `compact` answered None, as for "nothing to compact",
    and automatic compaction reported nothing. It now refuses FAILED_PRECONDITION
    (SESSION_CHANGED), and automatic compaction publishes a compaction_error. A delete that
    found nothing changes nothing and does not make it plan again."""

    async def scenario() -> tuple[str, int, list[str], int, int]:
        service: SessionsService | None = None
        streaming = True
        calls = 0

        class StreamedMeanwhile:
            """Summarizes while the newest message (outside every span) is updated."""

            async def summarize(self, prompt: str) -> str:
                nonlocal calls
                calls += 1
                assert service is not None
                if streaming:
                    await service.update(
                        "k", "", _message("m11").replace("text-m11", f"text-m11-{calls}"), from_client=True
                    )
                else:
                    await service.delete("k", "", ["no-such-id"])  # finds nothing
                return "S"

        executor = ThreadPoolExecutor(max_workers=4)
        registry = ObjectRegistry(tmp_path, executor, calls_in_flight=lambda: 5)
        service = SessionsService(registry, summarizer=StreamedMeanwhile())
        events: list[str] = []
        try:
            await service.append_many("k", "", [AppendInput(_message(f"m{i}"), Parent.auto(), True) for i in range(12)])
            await service.compactor.set_policy("k", "", Policy(0, 1))
            with pytest.raises(FailedPrecondition) as refused:
                await service.compactor.compact("k", "")
            asked_first = calls
            stored_first = len(await service.compactor.spans("k", ""))

            subscription = service.subscribe("k", None, 0, progress_seconds=3600)
            await anext(subscription)  # subscribed (its opening progress)
            await service.compactor._auto_compact("k", "")  # as an append over the threshold starts it
            async for item in subscription:
                if isinstance(item, ChangeEvent):
                    events.append(item.type)
                    if item.type == "compaction_error":
                        break
            await subscription.aclose()

            streaming = False
            record = await service.compactor.compact("k", "")
            stored = len(await service.compactor.spans("k", ""))
            assert record is not None
            return refused.value.reason, asked_first, events, stored_first, stored
        finally:
            await registry.close_all()
            executor.shutdown()

    reason, asked, events, stored_before, stored_after = asyncio.run(scenario())
    assert reason == "SESSION_CHANGED"
    assert asked == 3  # COMPACT_ATTEMPTS, each summary outrun
    assert stored_before == 0
    assert "compaction_error" in events
    assert stored_after == 1  # a delete that found nothing did not outrun the summary
