"""Server-side compaction against what happens while the summary is made, and what a summary
must include (audit of the twenty-first session). The summarizer is a real HTTP stub; a held
request (`HOLD`) pins the moment between the plan and the record, so each race is run in order,
not left to timing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.integrations.chat_completions import MAX_REPLY_BYTES
from tests.conftest import start_server
from tests.service.chat_completions_stub import HOLD, ChatCompletionsStub
from tests.service.support import text_message
from tests.service.test_compaction_summarizer import Summarizing, turn

GUARD_SECONDS = 30.0


@pytest.fixture
def summarizing(tmp_path: Path, llm: ChatCompletionsStub, monkeypatch: pytest.MonkeyPatch) -> Iterator[Summarizing]:
    monkeypatch.setenv("SESSIONS_TEST_RACES_KEY", "sk-test")
    server = Summarizing(tmp_path / "data", llm, "SESSIONS_TEST_RACES_KEY")
    yield server
    llm.release()
    server.stop()


def _session(summarizing: Summarizing, key: str, count: int = 20) -> Any:
    session = summarizing.client.object(key).session()
    session.append_messages([turn(i) for i in range(count)])
    session.set_compaction_policy(0, keep_recent_tokens=1)
    return session


def _compact_meanwhile(session: Any, llm: ChatCompletionsStub, change: Callable[[], None]) -> Any:
    """Runs `compact()` with the summarizer held, applies `change` once the model was asked,
    then lets the model answer; returns what `compact()` returned."""
    llm.mode = HOLD
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(session.compact()), name="compact")
    worker.start()
    llm.wait_for_requests(1)
    change()
    llm.release()
    worker.join(GUARD_SECONDS)
    assert not worker.is_alive() and outcome, "compact() never returned"
    return outcome[0]


def _texts(history: list[dict[str, Any]]) -> str:
    return " ".join(part.get("text", "") for message in history for part in message["parts"])


def test_compact_summarizes_every_overlay_its_span_hides(summarizing: Summarizing, llm: ChatCompletionsStub) -> None:
    """The prompt carried only the first overlay's summary as the previous one: a later overlay
    inside the span was hidden by the new record with its content in no summary at all."""
    session = _session(summarizing, "two-overlays")
    session.add_compaction("SUMMARY-ONE of the alpha fact", "m4", "m4")
    session.add_compaction("SUMMARY-TWO of the beta fact", "m6", "m6")
    record = session.compact()
    assert record is not None
    prompt = llm.requests[-1].prompt
    assert "SUMMARY-ONE" in prompt and "SUMMARY-TWO" in prompt
    ids = [m["id"] for m in session.get_history()]
    assert record.from_message_id == "m4" and ids[:5] == ["m0", "m1", "m2", "m3", "compaction_" + record.id]
    assert not any(i.startswith("compaction_") for i in ids[5:])  # both older overlays under the new one


def test_a_message_updated_while_its_summary_is_made_is_summarized_again(
    summarizing: Summarizing, llm: ChatCompletionsStub
) -> None:
    """The record was stored over the span as planned: the corrected message was hidden under a
    summary of its old text. The span is planned and summarized again."""
    session = _session(summarizing, "updated")
    corrected = text_message("m5", "CORRECTED-FACT in turn five")
    record = _compact_meanwhile(session, llm, lambda: session.update_message(corrected))
    assert record is not None
    assert len(llm.requests) == 2 and "CORRECTED-FACT" in llm.requests[1].prompt
    assert "CORRECTED-FACT" not in llm.requests[0].prompt
    assert record.summary == "summary #2"
    assert [r.summary for r in session.list_compactions()] == ["summary #2"]


@pytest.mark.parametrize("deleted", ["m5", "m17"], ids=["inside the span", "its last message"])
def test_a_message_deleted_while_its_summary_is_made_stays_deleted(
    summarizing: Summarizing, llm: ChatCompletionsStub, deleted: str
) -> None:
    """Inside the span, the deleted message's text came back through the summary; as the span's
    end, the record applied nowhere yet Compact answered compacted=true."""
    session = _session(summarizing, f"deleted-{deleted}")
    before = session.plan_compaction(keep_recent_tokens=1)
    assert before is not None and before.to_message_id == "m17"
    record = _compact_meanwhile(session, llm, lambda: session.delete_messages([deleted]))
    assert record is not None and len(llm.requests) == 2
    assert f"turn-{int(deleted[1:]):02d}" not in llm.requests[1].prompt
    assert deleted not in (record.from_message_id, record.to_message_id)
    history = session.get_history()
    assert "compaction_" + record.id in [m["id"] for m in history]  # the record applies
    assert f"turn-{int(deleted[1:]):02d}" not in _texts(history)


def test_two_compacts_at_once_store_one_record_for_a_span(summarizing: Summarizing, llm: ChatCompletionsStub) -> None:
    """Both planned the same span and both stored it (two model calls, two identical records)."""
    session = _session(summarizing, "twice")
    llm.mode = HOLD
    outcomes: list[Any] = []
    workers = [threading.Thread(target=lambda: outcomes.append(session.compact())) for _ in range(2)]
    for worker in workers:
        worker.start()
    llm.wait_for_requests(2)
    llm.release()
    for worker in workers:
        worker.join(GUARD_SECONDS)
    assert len(outcomes) == 2
    records = session.list_compactions()
    spans = [(r.from_message_id, r.to_message_id) for r in records]
    assert len(spans) == len(set(spans)), spans


def test_a_summary_larger_than_allowed_is_the_summarizers_failure(
    summarizing: Summarizing, llm: ChatCompletionsStub
) -> None:
    """The caller sent no summary: blaming it (INVALID_ARGUMENT, field summary) told it nothing."""
    session = _session(summarizing, "too-long")
    llm.content = "s" * (1024 * 1024 + 10)
    with pytest.raises(SessionsError) as refused:
        session.compact()
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "SUMMARIZER_FAILED")
    assert "max_summary_bytes" in refused.value.message
    assert session.list_compactions() == []


def test_shutdown_does_not_wait_for_the_summarizer_past_the_drain(
    tmp_path: Path, llm: ChatCompletionsStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An automatic compaction waiting on the model held the shutdown until the summarizer's
    timeout (60 s by default), past --drain-seconds (and Kubernetes' grace period)."""
    monkeypatch.setenv("SESSIONS_TEST_RACES_KEY", "sk-test")
    server = start_server(
        tmp_path / "data",
        summarizer_url=llm.url,
        summarizer_model="m",
        summarizer_api_key_env="SESSIONS_TEST_RACES_KEY",
        summarizer_timeout_seconds=GUARD_SECONDS * 4,
        drain_seconds=0.5,
    )
    llm.mode = HOLD
    from sessions_client import SessionsClient

    with SessionsClient(server.address) as client:
        session = client.object("held").session()
        session.set_compaction_policy(1, keep_recent_tokens=1)
        session.append_messages([turn(i) for i in range(20)])  # over the threshold: compacts in the background
    llm.wait_for_requests(1)
    stopper = threading.Thread(target=server.stop, name="stop")
    stopper.start()
    stopper.join(GUARD_SECONDS)  # the model is still held: only a bounded wait lets stop() end
    assert not stopper.is_alive(), "the shutdown waited for the summarizer"
    llm.release()


def test_a_reply_past_the_summarizers_bound_is_not_read_whole(
    summarizing: Summarizing, llm: ChatCompletionsStub
) -> None:
    """The reply was read into memory whatever its size."""
    session = _session(summarizing, "huge-reply")
    llm.content = "s" * (MAX_REPLY_BYTES + 1)
    with pytest.raises(SessionsError) as refused:
        session.compact()
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "SUMMARIZER_FAILED")
    assert f"more than {MAX_REPLY_BYTES} bytes" in refused.value.message


def test_model_calls_waiting_leave_the_servers_threads_to_others(
    summarizing: Summarizing, llm: ChatCompletionsStub
) -> None:
    """Model calls ran on asyncio's default executor, where listing, deleting and importing
    objects run too: a dozen slow summaries made ListObjects wait for them."""
    sessions = [_session(summarizing, f"slow-{index}") for index in range(8)]
    llm.mode = HOLD
    outcomes: list[Any] = []
    workers = [threading.Thread(target=lambda s=s: outcomes.append(s.compact())) for s in sessions]
    for worker in workers:
        worker.start()
    try:
        llm.wait_for_requests(4)  # as many as run at once; the others wait their turn
        listed = summarizing.client._stub.ListObjects(pb.ListObjectsRequest(), timeout=GUARD_SECONDS / 3)
        assert len(listed.object_keys) == 8  # answered while every model call is held
        assert len(llm.requests) == 4 and not llm._released.is_set()
    finally:
        llm.release()
        for worker in workers:
            worker.join(GUARD_SECONDS)
    assert len(outcomes) == 8 and all(record is not None for record in outcomes)
