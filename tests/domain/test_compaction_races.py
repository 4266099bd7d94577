"""`Compact` stores its record unless what the summary was made of changed while it was made:
an update or delete of a message of its span, of a message beside it or of an end of a record it
extends; a clear, another record, the object's file replaced. Other changes meanwhile (a reply
streamed into the newest message, imports, the object closed to make room) keep it. A change
counted inside a write job but not yet committed as the plan began counts too.

Runs the domain over real object files (no gRPC); the summarizers here make the changes while
they are asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import service as service_module
from sessions_server.domain.compactor import Policy, Summarizer
from sessions_server.domain.errors import FailedPrecondition
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.feed import ChangeEvent
from sessions_server.storage.queries import CompactionSpan
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from sessions_server.storage.store import WriteContext


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": f"text-{message_id}"}]})


async def _span_ends(service: SessionsService) -> list[tuple[str, str]]:
    """The (from, to) of each compaction record of "k"'s session "", lowest seq first."""
    return [(span.from_message_id, span.to_message_id) for span in await service.compactor.spans("k", "")]


async def _history_ids(service: SessionsService) -> list[str]:
    """The ids "k"'s session "" reads as, overlays applied."""
    return [view.info.id async for window in service.history("k", "") for view in window]


@contextlib.asynccontextmanager
async def _service(
    tmp_path: Path, summarizer: Summarizer, *, messages: int = 12, max_open: int = 64
) -> AsyncIterator[SessionsService]:
    """A service over real object files in `tmp_path`, its writes on threads (as under load), the
    session "" of object "k" holding `messages` messages, m0 on."""
    executor = ThreadPoolExecutor(max_workers=4)
    registry = ObjectRegistry(tmp_path, executor, max_open=max_open, calls_in_flight=lambda: 5)
    service = SessionsService(registry, summarizer=summarizer)
    try:
        await service.append_many(
            "k", "", [AppendInput(_message(f"m{i}"), Parent.auto(), True) for i in range(messages)]
        )
        yield service
    finally:
        await registry.close_all()
        executor.shutdown()


def test_a_change_committed_while_compact_summarizes_makes_it_plan_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted, proceed = threading.Event(), threading.Event()
    original = service_module.note_session_changed
    prompts: list[str] = []

    def held(ctx: WriteContext, session_id: str, changed: frozenset[str] | None) -> None:
        original(ctx, session_id, changed)
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

        async with _service(tmp_path, Echo()) as service:
            try:
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
                proceed.set()  # before the close, which waits for the delete's job

    summary, asked = asyncio.run(scenario())
    assert "text-m5" in asked[0]  # the first plan still had it: its summary was made again
    assert len(asked) == 2
    assert "text-m4" in summary and "text-m5" not in summary


def test_a_compact_whose_span_changed_every_time_says_so_and_stores_nothing(tmp_path: Path) -> None:
    """A compaction audit: while each summary was made a message of its span was updated; after
    three summaries `compact` answered None, as for "nothing to compact", and automatic
    compaction reported nothing. It now refuses FAILED_PRECONDITION (SESSION_CHANGED), and
    automatic compaction publishes a compaction_error."""

    async def scenario() -> tuple[str, int, list[str], int]:
        calls = 0

        class EditedMeanwhile:
            """Summarizes while a message the span holds (m5) is edited."""

            async def summarize(self, prompt: str) -> str:
                nonlocal calls
                calls += 1
                await service.update("k", "", _message("m5").replace("text-m5", f"text-m5-{calls}"), from_client=True)
                return "S"

        events: list[str] = []
        async with _service(tmp_path, EditedMeanwhile()) as service:
            await service.compactor.set_policy("k", "", Policy(0, 1))
            with pytest.raises(FailedPrecondition) as refused:
                await service.compactor.compact("k", "")
            asked_first = calls

            subscription = service.subscribe("k", None, 0, progress_seconds=3600)
            await anext(subscription)  # subscribed (its opening progress)
            await service.compactor._auto_compact("k", "")  # as an append over the threshold starts it
            async for item in subscription:
                if isinstance(item, ChangeEvent):
                    events.append(item.type)
                    if item.type == "compaction_error":
                        break
            await subscription.aclose()
            return refused.value.reason, asked_first, events, len(await service.compactor.spans("k", ""))

    reason, asked, events, stored = asyncio.run(scenario())
    assert reason == "SESSION_CHANGED"
    assert asked == 3  # COMPACT_ATTEMPTS, each summary outrun
    assert "compaction_error" in events
    assert stored == 0


@pytest.mark.parametrize(
    "meanwhile",
    ["update the newest message", "delete the newest message", "delete an unknown id", "import a message"],
)
def test_a_change_outside_the_span_while_compact_summarizes_keeps_its_record(tmp_path: Path, meanwhile: str) -> None:
    """The compaction audit's first finding: a reply streaming into the newest message (outside
    every span) while the summary was made threw the summary away, three times over. Only a
    change to what the summary was made of refuses it now; the record is stored at the first
    try, over the span planned."""

    async def scenario() -> tuple[int, list[tuple[str, str]], list[str]]:
        calls = 0

        class ChangedMeanwhile:
            async def summarize(self, prompt: str) -> str:
                nonlocal calls
                calls += 1
                if meanwhile == "update the newest message":
                    await service.update("k", "", _message("m11").replace("text-m11", "streamed"), from_client=True)
                elif meanwhile == "delete the newest message":
                    assert await service.delete("k", "", ["m11"]) == 1
                elif meanwhile == "delete an unknown id":
                    assert await service.delete("k", "", ["no-such-id"]) == 0
                else:
                    async with service.importer("k", "") as importer:
                        await importer.add(_message("imported"), "m11", 1)
                return "S"

        async with _service(tmp_path, ChangedMeanwhile()) as service:
            record = await service.compactor.compact("k", "", keep_recent_tokens=1)
            assert record is not None
            spans = await _span_ends(service)
            ids = await _history_ids(service)
            return calls, spans, ids

    calls, spans, ids = asyncio.run(scenario())
    assert calls == 1
    assert spans == [("m3", "m9")]
    assert ids[:3] == ["m0", "m1", "m2"] and ids[3].startswith("compaction_") and ids[4] == "m10"


@pytest.mark.parametrize("then", ["nothing", "edit its span", "erase and write it again"])
def test_a_compact_whose_object_closed_to_make_room_meanwhile_keeps_its_record(tmp_path: Path, then: str) -> None:
    """The compaction audit's second finding: with few objects open at once, the object closed
    to make room while the model was asked, and the reopened object was another store: every
    try was refused though nothing changed. The watch lasts through the close; it still sees a
    change of the span made after the reopen, and an object erased and written anew is no
    longer the one planned."""

    async def scenario() -> tuple[int, list[bool], int, str | None]:
        calls = 0
        closed_meanwhile: list[bool] = []

        class OthersWrittenMeanwhile:
            async def summarize(self, prompt: str) -> str:
                nonlocal calls
                calls += 1
                await service.append_many("other", "", [AppendInput(_message(f"o{calls}"), Parent.auto(), True)])
                closed_meanwhile.append(not service.registry.is_open("k"))
                if then == "edit its span":
                    await service.update("k", "", _message("m5").replace("text-m5", f"edit-{calls}"), from_client=True)
                elif then == "erase and write it again":
                    assert await service.objects.erase("k")
                    await service.append_many(
                        "k", "", [AppendInput(_message(f"m{i}"), Parent.auto(), True) for i in range(12)]
                    )
                return "S"

        async with _service(tmp_path, OthersWrittenMeanwhile(), max_open=1) as service:
            reason = None
            try:
                await service.compactor.compact("k", "", keep_recent_tokens=1)
            except FailedPrecondition as refused:
                reason = refused.reason
            return calls, closed_meanwhile, len(await service.compactor.spans("k", "")), reason

    calls, closed, stored, reason = asyncio.run(scenario())
    assert all(closed)  # the object did close while the model was asked
    if then == "nothing":
        assert (calls, stored, reason) == (1, 1, None)
    else:
        assert (calls, stored, reason) == (3, 0, "SESSION_CHANGED")


@pytest.mark.parametrize(
    ("meanwhile", "stored"),
    [("delete m6, where the record it extends ends", False), ("update m4, under the record it extends", True)],
)
def test_a_compact_extending_a_record_depends_on_its_ends(tmp_path: Path, meanwhile: str, stored: bool) -> None:
    """A span that extends an earlier record starts where that record did and takes its summary:
    deleting one of the record's ends while the summary is made leaves the earlier overlay
    unshown and the new one starting nowhere, so the summary is made again; a message under
    the record (in its summary, not in the prompt) changes nothing the new summary holds."""

    async def scenario() -> tuple[int, list[tuple[str, str]]]:
        calls = 0

        class ChangedMeanwhile:
            async def summarize(self, prompt: str) -> str:
                nonlocal calls
                calls += 1
                assert ("earlier summary" in prompt) == (calls == 1 or stored)
                if calls == 1 and meanwhile.startswith("delete"):
                    assert await service.delete("k", "", ["m6"]) == 1
                elif calls == 1:
                    await service.update("k", "", _message("m4").replace("text-m4", "edited"), from_client=True)
                return "S"

        async with _service(tmp_path, ChangedMeanwhile(), messages=14) as service:
            await service.compactor.add("k", "", "earlier summary", "m3", "m6")
            record = await service.compactor.compact("k", "", keep_recent_tokens=1)
            assert record is not None
            return calls, await _span_ends(service)

    calls, spans = asyncio.run(scenario())
    if stored:
        assert (calls, spans) == (1, [("m3", "m6"), ("m3", "m11")])
    else:
        # Planned again without the deleted end: the earlier record no longer shows, and the new
        # span starts after the protected head, as on a session without it.
        assert calls == 2 and spans[-1] == ("m3", "m11"), spans


def test_a_compact_whose_object_was_replaced_while_it_planned_still_watches_the_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: the object was erased and written again while compact's first plan read; the
    watch saw "everything", planning began again on the new file, and the watch, restarted, was
    left with the old file's feed: an edit of m5 (in the span) while the model was asked went
    unseen and the summary of the old m5 was stored. The watches are the key's now, whichever
    file and feed the object has."""

    async def scenario() -> tuple[int, list[str], str]:
        prompts: list[str] = []

        class EditsM5Once:
            async def summarize(self, prompt: str) -> str:
                prompts.append(prompt)
                if len(prompts) == 1:
                    await service.update("k", "", _message("m5").replace("text-m5", "edited-m5"), from_client=True)
                return "S:" + ",".join(re.findall(r"(?:text|edited)-m\d+", prompt.split("Use this structure")[0]))

        replaced = False

        async def spans_after_replacing(object_key: str, session_id: str) -> list[CompactionSpan]:
            nonlocal replaced
            if not replaced:  # between the first plan's two reads
                replaced = True
                assert await service.objects.erase("k")
                await service.append_many(
                    "k", "", [AppendInput(_message(f"m{i}"), Parent.auto(), True) for i in range(12)]
                )
            return await read_records(object_key, session_id)

        async with _service(tmp_path, EditsM5Once()) as service:
            read_records = service.compactor.spans
            monkeypatch.setattr(service.compactor, "spans", spans_after_replacing)
            record = await service.compactor.compact("k", "", keep_recent_tokens=1)
            assert record is not None
            return len(prompts), prompts, record.summary

    asked, prompts, summary = asyncio.run(scenario())
    assert asked == 2  # the first summary, of the m5 edited meanwhile, was made again
    assert "edited-m5" in prompts[1]
    assert "edited-m5" in summary and "text-m5" not in summary


@pytest.mark.parametrize("meanwhile", ["import 10,001 messages", "delete one message past the span among 10,000 ids"])
def test_many_changes_outside_the_span_keep_the_record(tmp_path: Path, meanwhile: str) -> None:
    """A review: imports noted the ids they inserted and deletes every id asked for, so 10,001
    of them while the model was asked passed the watch's bound and refused the summary, though
    none was in the span. Imports change nothing a summary holds, and once planned a watch
    keeps only what the plan depends on."""

    async def scenario() -> tuple[int, list[tuple[str, str]]]:
        calls = 0

        class ChangedMeanwhile:
            async def summarize(self, prompt: str) -> str:
                nonlocal calls
                calls += 1
                if meanwhile.startswith("import"):
                    async with service.importer("k", "") as importer:
                        parent = "m11"
                        for i in range(10_001):
                            await importer.add(_message(f"i{i}"), parent, 1)
                            parent = f"i{i}"
                else:
                    assert await service.delete("k", "", ["m11"] + [f"unknown{i}" for i in range(10_000)]) == 1
                return "S"

        async with _service(tmp_path, ChangedMeanwhile()) as service:
            assert await service.compactor.compact("k", "", keep_recent_tokens=1) is not None
            return calls, await _span_ends(service)

    assert asyncio.run(scenario()) == (1, [("m3", "m9")])


def test_a_message_beside_the_span_whose_tool_parts_placed_its_end_is_watched(tmp_path: Path) -> None:
    """A review: the span ends at m9, which calls a tool; while the model was asked, m10 (the
    first message kept) was updated into that call's answer. A plan made then ends at m8 (a call
    stays with its answer); the record stored hid the call and showed its answer. The messages
    beside the span's boundaries are watched: the summary is made again, up to m8."""
    call = json.dumps(
        {
            "id": "m9",
            "role": "assistant",
            "parts": [{"type": "tool-x", "toolCallId": "c1", "state": "input-available", "input": {}}],
        }
    )
    answer = json.dumps(
        {
            "id": "m10",
            "role": "tool",
            "parts": [{"type": "tool-x", "toolCallId": "c1", "state": "output-available", "output": "42"}],
        }
    )

    async def scenario() -> tuple[int, list[tuple[str, str]], list[str]]:
        calls = 0

        class AnswersMeanwhile:
            async def summarize(self, prompt: str) -> str:
                nonlocal calls
                calls += 1
                if calls == 1:
                    await service.update("k", "", answer, from_client=True)
                return "S"

        async with _service(tmp_path, AnswersMeanwhile(), messages=0) as service:
            texts = [_message(f"m{i}") for i in range(9)] + [call, _message("m10"), _message("m11")]
            await service.append_many("k", "", [AppendInput(text, Parent.auto(), True) for text in texts])
            assert await service.compactor.compact("k", "", keep_recent_tokens=1) is not None
            return calls, await _span_ends(service), await _history_ids(service)

    calls, spans, ids = asyncio.run(scenario())
    assert (calls, spans) == (2, [("m3", "m8")])
    assert ids[4:] == ["m9", "m10", "m11"]  # the call shown with its answer
