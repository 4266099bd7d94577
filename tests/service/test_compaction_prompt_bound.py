"""`Compact` and automatic compaction bound the summarizer prompt as PlanCompaction does.

`Compact` planned without a bound: 70 messages of 5 MB with keep_recent_tokens=1 made a 325 MB
prompt and took the server's memory up by 1.9 GB, and automatic compaction ran the same code in
the background. Now a prompt past MAX_SUMMARIZER_PROMPT_BYTES (3 MiB, PlanCompaction's bound) is
refused as soon as its text passes it, before the summarizer is asked: `Compact` answers
RESOURCE_EXHAUSTED (LIMIT_EXCEEDED, naming the limit and what to do), automatic compaction
logs it and publishes a compaction_error event, and the append that started it stands.

The bound is lowered for the test (the server runs in this process); the summarizer is the
chat-completions stub.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from sessions_server.domain import compactor
from tests.domain.test_compaction_plan_reads import _count_renderings
from tests.service.chat_completions_stub import ChatCompletionsStub, FeedReader
from tests.service.support import text_message
from tests.service.test_compaction_summarizer import Summarizing, api_key_env  # noqa: F401  (a fixture)

BOUND = 20_000
TURN_BYTES = 3_000


@pytest.fixture
def summarizing(tmp_path: Path, llm: ChatCompletionsStub, api_key_env: tuple[str, str]) -> Iterator[Summarizing]:  # noqa: F811
    server = Summarizing(tmp_path / "data", llm, api_key_env[0])
    yield server
    llm.release()
    server.stop()


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Lowers the bound; returns the ids of the messages rendered into prompts from now on."""
    monkeypatch.setattr(compactor, "MAX_SUMMARIZER_PROMPT_BYTES", BOUND, raising=False)
    return _count_renderings(monkeypatch)


def _turns(session: Any, count: int) -> None:
    """`count` turns of about TURN_BYTES: with keep_recent_tokens=1 the span is m3..m<count-3>."""
    session.append_messages([text_message(f"m{i}", f"turn {i} " + "w" * TURN_BYTES) for i in range(count)])


def test_compact_refuses_a_prompt_past_the_bound_before_asking_the_summarizer(
    summarizing: Summarizing, llm: ChatCompletionsStub, bound: list[str]
) -> None:
    session = summarizing.client.object("bounded").session()
    _turns(session, 20)  # a span of 15 turns: 45 KB
    with pytest.raises(SessionsError) as refused:
        session.compact(keep_recent_tokens=1)
    error = refused.value
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert error.metadata == {"limit": "max_summarizer_prompt_bytes", "limit_value": str(BOUND)}
    assert "keep_recent_tokens" in error.message and "AddCompaction" in error.message
    assert llm.requests == [] and session.list_compactions() == []
    # Refused as the text passed the bound: the span's first messages were rendered, not all.
    assert bound == [f"m{i}" for i in range(3, 3 + BOUND // TURN_BYTES + 1)]

    # A span within the bound (a larger tail kept) is summarized as before.
    bound.clear()
    record = session.compact(keep_recent_tokens=13 * TURN_BYTES // 4)
    assert record is not None and (record.from_message_id, record.to_message_id) == ("m3", "m7")
    (request,) = llm.requests
    assert len(request.prompt.encode()) <= BOUND
    assert bound == [f"m{i}" for i in range(3, 8)]


def test_automatic_compaction_past_the_bound_emits_compaction_error_and_the_append_stands(
    summarizing: Summarizing, llm: ChatCompletionsStub, bound: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    session = summarizing.client.object("auto-bounded").session("s")
    _turns(session, 20)
    session.set_compaction_policy(1, keep_recent_tokens=1)
    with caplog.at_level(logging.WARNING, logger="sessions.compaction"):
        with FeedReader(summarizing.address, "auto-bounded") as feed:
            assert session.append_message(text_message("trigger", "one more")).inserted
            failed = feed.until("compaction_error", "compact")
        assert (failed.type, failed.session_id) == ("compaction_error", "s")
        assert "max_summarizer_prompt_bytes" in failed.error and str(BOUND) in failed.error
        summarizing.stop()  # waits for automatic compactions
    assert any("max_summarizer_prompt_bytes" in record.getMessage() for record in caplog.records)
    assert llm.requests == []
    summarizing.restart()
    session = summarizing.client.object("auto-bounded").session("s")
    assert session.get_message("trigger") is not None and session.list_compactions() == []
