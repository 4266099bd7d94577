"""Server-side compaction (issue 6; DESIGN.md §7): the compaction policy (persisted in
`cf_agents_session_config`), `Compact` with the configured chat-completions summarizer, and
automatic compaction after an inserted append whose session estimate is strictly over the
threshold. The summarizer is a real HTTP server on a loopback port (chat_completions_stub).

Waiting is deterministic: for something that must happen, the test reads the change feed until
the event arrives (bounded by a deadline); for something that must not happen, the test stops the
server, which waits for running automatic compactions, and then checks that the summarizer was
never asked and the object file holds no record.
"""

from __future__ import annotations

import math
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import CompactionPolicy, SessionsClient, SessionsError
from sessions_server.storage.paths import object_path
from tests.conftest import LiveServer, start_server
from tests.service.chat_completions_stub import EMPTY, FAIL, HANG, ChatCompletionsStub, FeedReader
from tests.service.support import text_message

MODEL = "stub-model"
TIMEOUT_SECONDS = 1.0


def string_tokens(text: str) -> int:
    return 0 if not text else math.ceil(max(len(text) / 4, len(text.split()) * 1.3))


def turn(index: int) -> dict[str, Any]:
    words = " ".join(f"w{index}x{k}" for k in range(30))
    return text_message(f"m{index}", f"turn-{index:02d} {words}", role="user" if index % 2 == 0 else "assistant")


def estimate(session: Any) -> int:
    """The session estimate while no overlay applies: the stamped row estimates of the path."""
    return sum(stat.token_estimate for stat in session.get_history_row_stats())


def trigger_message(message_id: str = "trigger") -> tuple[dict[str, Any], int]:
    text = "one more turn to push the estimate"
    return text_message(message_id, text), 4 + string_tokens(text)


def compaction_rows(data_dir: Path, key: str) -> list[tuple[str, str, str, str]]:
    conn = sqlite3.connect(f"file:{object_path(data_dir, key)}?mode=ro", uri=True)
    try:
        return [
            tuple(row)
            for row in conn.execute(
                "SELECT session_id, summary, from_message_id, to_message_id FROM cf_agents_session_compactions"
            )
        ]
    finally:
        conn.close()


@pytest.fixture
def api_key_env(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    name = f"SESSIONS_TEST_SUMMARIZER_KEY_{uuid.uuid4().hex}"
    monkeypatch.setenv(name, "sk-test-key")
    return name, "sk-test-key"


class Summarizing:
    """A server with the stub as its summarizer; `restart()` keeps the data directory."""

    def __init__(self, data_dir: Path, llm: ChatCompletionsStub, api_key_env: str) -> None:
        self.data_dir = data_dir
        self._options = {
            "summarizer_url": llm.url,
            "summarizer_model": MODEL,
            "summarizer_timeout_seconds": TIMEOUT_SECONDS,
            "summarizer_api_key_env": api_key_env,
        }
        self.server: LiveServer | None = start_server(data_dir, **self._options)
        self.client = SessionsClient(self.server.address)

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    def stop(self) -> None:
        """Stops the server; it waits for running automatic compactions first."""
        self.client.close()
        if self.server is not None:
            self.server.stop()
            self.server = None

    def restart(self) -> None:
        self.stop()
        self.server = start_server(self.data_dir, **self._options)
        self.client = SessionsClient(self.server.address)


@pytest.fixture
def summarizing(tmp_path: Path, llm: ChatCompletionsStub, api_key_env: tuple[str, str]) -> Iterator[Summarizing]:
    server = Summarizing(tmp_path / "data", llm, api_key_env[0])
    yield server
    llm.release()
    server.stop()


def _setup(summarizing: Summarizing, key: str, count: int = 12, session_id: str = "") -> Any:
    session = summarizing.client.object(key).session(session_id)
    session.append_messages([turn(i) for i in range(count)])
    return session


# ── policy ──────────────────────────────────────────────────────────────────


def test_policy_defaults_to_zero_and_is_per_session(summarizing: Summarizing):
    obj = summarizing.client.object("policies")
    assert obj.session("a").get_compaction_policy() == CompactionPolicy(0, 0)
    assert obj.session("a").set_compaction_policy(5000, keep_recent_tokens=300) == CompactionPolicy(5000, 300)
    assert obj.session("a").get_compaction_policy() == CompactionPolicy(5000, 300)
    assert obj.session("b").get_compaction_policy() == CompactionPolicy(0, 0)
    assert obj.session("a").set_compaction_policy(0) == CompactionPolicy(0, 0)
    assert obj.session("a").get_compaction_policy() == CompactionPolicy(0, 0)


def test_a_call_for_an_object_moved_away_is_told_its_owner_before_the_missing_summarizer(
    live_server: LiveServer, object_key: str
):
    """The refusal for want of a summarizer came first, though the object's owner may have one."""
    from sessions_client._common import routing_metadata
    from sessions_proto.v1 import sessions_pb2 as pb

    with SessionsClient(live_server.address, retry=None) as client:  # the clients retry OBJECT_NOT_OWNED
        client.object(object_key).session().append_message(text_message("m1"))
        client._stub.DeleteObject(
            pb.DeleteObjectRequest(object_key=object_key, moved_to="owner:1"), metadata=routing_metadata(object_key)
        )
        moved = client.object(object_key).session()
        for call in (lambda: moved.set_compaction_policy(5000), moved.compact):
            with pytest.raises(SessionsError) as caught:
                call()
            assert (caught.value.code, caught.value.reason) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "OBJECT_NOT_OWNED",
            )
            assert "owner:1" in caught.value.message


@pytest.mark.parametrize(("threshold", "keep"), [(-1, 0), (10, -5)])
def test_negative_policy_values_are_invalid(session: Any, threshold: int, keep: int):
    with pytest.raises(SessionsError) as caught:
        session.set_compaction_policy(threshold, keep_recent_tokens=keep)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert session.get_compaction_policy() == CompactionPolicy(0, 0)


def test_a_threshold_on_a_server_without_a_summarizer_is_refused_and_stores_nothing(session: Any):
    """It would never compact anything, and nothing would say so; keep_recent_tokens alone is
    still of use (PlanCompaction's tail)."""
    with pytest.raises(SessionsError) as caught:
        session.set_compaction_policy(5000, keep_recent_tokens=300)
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NO_SUMMARIZER")
    assert "--summarizer-url" in str(caught.value)
    assert session.get_compaction_policy() == CompactionPolicy(0, 0)
    assert session.set_compaction_policy(0, keep_recent_tokens=300) == CompactionPolicy(0, 300)
    assert session.get_compaction_policy() == CompactionPolicy(0, 300)


def test_policy_is_persisted_in_the_config_table_and_survives_a_restart(tmp_path: Path):
    data_dir = tmp_path / "data"
    # A summarizer configured, never called: the policy's threshold is never reached.
    server = start_server(data_dir, summarizer_url="http://127.0.0.1:9/v1", summarizer_model=MODEL)
    try:
        with SessionsClient(server.address) as client:
            client.object("policy").session("s").set_compaction_policy(1234, keep_recent_tokens=56)
    finally:
        server.stop()
    conn = sqlite3.connect(f"file:{object_path(data_dir, 'policy')}?mode=ro", uri=True)
    try:
        sessions = {row[0] for row in conn.execute("SELECT session_id FROM cf_agents_session_config")}
    finally:
        conn.close()
    assert sessions == {"s"}
    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client:
            assert client.object("policy").session("s").get_compaction_policy() == CompactionPolicy(1234, 56)
            assert client.object("policy").session("").get_compaction_policy() == CompactionPolicy(0, 0)
    finally:
        server.stop()


def test_a_threshold_a_server_without_a_summarizer_finds_stored_is_told_once_a_minute(tmp_path: Path):
    """Set where a summarizer was, then the server restarted without one: appends far past the
    threshold compacted nothing, and nothing said so (no event, no log), the silence the refusal
    of such a threshold is there to prevent."""
    data_dir = tmp_path / "data"
    server = start_server(data_dir, summarizer_url="http://127.0.0.1:9/v1", summarizer_model=MODEL)
    try:
        with SessionsClient(server.address) as client:
            client.object("kept").session("s").set_compaction_policy(1, keep_recent_tokens=1)
    finally:
        server.stop()
    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client, FeedReader(server.address, "kept") as feed:
            session = client.object("kept").session("s")
            assert session.append_message(text_message("m1", "past the threshold")).inserted
            assert feed.next().type == "append"
            told = feed.next()
            assert (told.type, told.session_id) == ("compaction_error", "s")
            assert "threshold of 1 tokens compacts nothing here" in str(told.error)
            assert "--summarizer-url" in str(told.error)
            for index in (2, 3):  # within the minute: told once
                assert session.append_message(text_message(f"m{index}", "more")).inserted
            assert [feed.next().type for _ in range(2)] == ["append", "append"]
            assert session.list_compactions() == []
            assert session.append_message(text_message("m4", "below")).inserted  # still nothing
            session.set_compaction_policy(0, keep_recent_tokens=1)
            assert session.append_message(text_message("m5", "no threshold")).inserted
            assert [feed.next().type for _ in range(2)] == ["append", "append"]
    finally:
        server.stop()


# ── Compact with the server's summarizer ────────────────────────────────────


def test_compact_without_a_summarizer_fails_precondition(session: Any):
    session.append_messages([turn(i) for i in range(12)])
    with pytest.raises(SessionsError) as caught:
        session.compact()
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.reason == "NO_SUMMARIZER"
    assert session.list_compactions() == []


def test_compact_sends_the_plan_prompt_to_the_chat_completions_endpoint(
    summarizing: Summarizing, llm: ChatCompletionsStub, api_key_env: tuple[str, str]
):
    session = _setup(summarizing, "compact")
    session.set_compaction_policy(0, keep_recent_tokens=1)  # no automatic compaction; tail budget 1
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None

    record = session.compact()
    assert record is not None
    (request,) = llm.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == MODEL
    assert request.body["messages"][0]["role"] == "user"
    assert request.body["messages"][0]["content"] == plan.prompt
    assert request.headers.get("Authorization") == f"Bearer {api_key_env[1]}"
    assert (record.summary, record.from_message_id, record.to_message_id) == ("summary #1", "m3", "m9")
    assert session.list_compactions() == [record]
    assert [m["id"] for m in session.get_history()] == ["m0", "m1", "m2", "compaction_" + record.id, "m10", "m11"]


def test_compact_emits_compact_without_payload(summarizing: Summarizing):
    session = _setup(summarizing, "compact-event", session_id="s")
    session.set_compaction_policy(0, keep_recent_tokens=1)
    with FeedReader(summarizing.address, "compact-event") as feed:
        record = session.compact()
        event = feed.next()
    assert record is not None
    assert (event.type, event.session_id, event.message, event.compaction) == ("compact", "s", None, None)


def test_compact_with_nothing_to_compact_does_not_call_the_model(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "small", count=5)
    assert session.compact() is None
    session = _setup(summarizing, "default-keep", count=12)  # all fits the default 20,000 tokens
    assert session.compact() is None
    assert llm.requests == []


def test_compact_with_an_empty_summary_stores_nothing(summarizing: Summarizing, llm: ChatCompletionsStub):
    llm.mode = EMPTY
    session = _setup(summarizing, "empty")
    session.set_compaction_policy(0, keep_recent_tokens=1)
    assert session.compact() is None
    assert len(llm.requests) == 1
    assert session.list_compactions() == []


@pytest.mark.parametrize(
    ("summary", "stored"),
    [("\ufeff \u3000", False), ("\x85", True), ("\x1c", True)],
    ids=["js-blank", "next-line", "file-separator"],
)
def test_a_summary_is_blank_by_javascripts_trim(
    summarizing: Summarizing, llm: ChatCompletionsStub, summary: str, stored: bool
):
    """Upstream drops a summary that JavaScript's trim() empties; Python's strip() kept U+FEFF
    and dropped U+0085 and U+001C, which JavaScript keeps."""
    llm.content = summary
    session = _setup(summarizing, f"trim-{ord(summary[0])}")
    assert (session.compact(keep_recent_tokens=1) is not None) is stored
    assert [record.summary for record in session.list_compactions()] == ([summary] if stored else [])


def test_compact_keeps_the_recent_tail_the_call_asks_for(summarizing: Summarizing, llm: ChatCompletionsStub):
    """`keep_recent_tokens` on the call (as PlanCompaction takes it) wins over the session's
    policy; the clients sent none, so the server kept the policy's 20,000 tokens and, with all
    of this session within them, compacted nothing."""
    session = _setup(summarizing, "keep-on-call", count=12)
    assert session.get_compaction_policy().keep_recent_tokens == 0  # the policy's: 20,000
    planned = session.plan_compaction(keep_recent_tokens=1)
    assert planned is not None
    record = session.compact(keep_recent_tokens=1)
    assert record is not None
    assert (record.from_message_id, record.to_message_id) == (planned.from_message_id, planned.to_message_id)
    (request,) = llm.requests
    assert request.body["messages"][0]["content"] == planned.prompt
    with pytest.raises(SessionsError) as refused:
        session.compact(keep_recent_tokens=-1)
    assert (refused.value.code, refused.value.metadata.get("field")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "keep_recent_tokens",
    )


def test_compact_follows_the_leaf_given(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "leaf", count=4)
    session.append_messages([text_message(f"b{i}", f"branch {i}") for i in range(6)], parent_id="m1")
    session.append_message(text_message("tip", "main again"), parent_id="m3")
    session.set_compaction_policy(0, keep_recent_tokens=1)
    record = session.compact(leaf_id="b5")
    assert record is not None and (record.from_message_id, record.to_message_id) == ("b1", "b3")


# ── automatic compaction ────────────────────────────────────────────────────


def test_append_strictly_over_the_threshold_compacts_automatically(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "auto")
    message, tokens = trigger_message()
    session.set_compaction_policy(estimate(session) + tokens - 1, keep_recent_tokens=1)
    with FeedReader(summarizing.address, "auto") as feed:
        assert session.append_message(message).inserted
        compacted = feed.until("compact", "compaction_error")
    assert compacted.type == "compact"
    appended = feed.seen[0]
    assert (appended.type, appended.message and appended.message["id"]) == ("append", "trigger")
    assert compacted.revision > appended.revision
    (record,) = session.list_compactions()
    # Planned on the active branch with the policy's keep-recent budget: m0 m1 m2 | m3..m10 | m11 trigger.
    assert (record.summary, record.from_message_id, record.to_message_id) == ("summary #1", "m3", "m10")
    assert llm.requests[0].prompt.startswith("Create a concise summary")
    assert [m["id"] for m in session.get_history()] == ["m0", "m1", "m2", "compaction_" + record.id, "m11", "trigger"]

    # The estimate now counts the summary instead of the covered rows: a small append stays under.
    session.append_message(text_message("after", "small"))
    summarizing.stop()
    assert len(llm.requests) == 1


def test_upsert_of_a_new_id_and_batched_appends_also_trigger(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "upsert")
    message, tokens = trigger_message("upserted")
    session.set_compaction_policy(estimate(session) + tokens - 1, keep_recent_tokens=1)
    with FeedReader(summarizing.address, "upsert") as feed:
        assert session.upsert_message(message).inserted
        assert feed.until("compact", "compaction_error").type == "compact"

    other = summarizing.client.object("batch").session()
    other.append_messages([turn(i) for i in range(10)])
    first, tokens = trigger_message("b1")
    second, more = trigger_message("b2")
    other.set_compaction_policy(estimate(other) + tokens + more - 1, keep_recent_tokens=1)
    with FeedReader(summarizing.address, "batch") as feed:
        other.append_messages([first, second])
        assert feed.until("compact", "compaction_error").type == "compact"
    summarizing.stop()
    assert len(llm.requests) == 2  # one per triggering call


def test_estimate_equal_to_the_threshold_does_not_compact(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "equal")
    message, tokens = trigger_message()
    session.set_compaction_policy(estimate(session) + tokens, keep_recent_tokens=1)
    assert session.append_message(message).inserted
    assert estimate(session) == session.get_compaction_policy().threshold_tokens
    summarizing.stop()  # waits for any automatic compaction the append started
    assert llm.requests == []
    assert compaction_rows(summarizing.data_dir, "equal") == []


def test_writes_other_than_inserted_appends_never_trigger(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "quiet")
    session.set_compaction_policy(1, keep_recent_tokens=1)  # already far over: setting it does not compact
    assert not session.append_message(turn(5)).inserted  # duplicate append
    assert not session.append_messages([turn(6), turn(7)])[0].inserted  # duplicate batch
    assert not session.upsert_message(turn(8)).inserted  # upsert of an existing id: an update
    session.update_message(text_message("m9", "changed text " * 50))
    session.import_message(text_message("imported", "words " * 100), parent_id="m11", created_at=1)
    assert not session.append_message(text_message("compaction_echo", "echo")).inserted
    session.delete_messages(["m1"])
    record = session.add_compaction("manual", "m3", "m4")
    assert record.seq == 1
    summarizing.stop()
    assert llm.requests == []
    assert compaction_rows(summarizing.data_dir, "quiet") == [("", "manual", "m3", "m4")]


def test_policy_threshold_zero_disables_automatic_compaction(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "disabled")
    session.set_compaction_policy(0, keep_recent_tokens=1)
    session.append_message(trigger_message()[0])
    summarizing.stop()
    assert llm.requests == []


def test_summarizer_failure_never_fails_the_append_and_emits_compaction_error(
    summarizing: Summarizing, llm: ChatCompletionsStub
):
    llm.mode = FAIL
    session = _setup(summarizing, "failing", session_id="s")
    session.set_compaction_policy(1, keep_recent_tokens=1)
    with FeedReader(summarizing.address, "failing") as feed:
        appended = session.append_message(text_message("t1", "first trigger"))
        assert appended.inserted
        failed = feed.until("compaction_error", "compact")
        assert (failed.type, failed.session_id, failed.message, failed.compaction) == (
            "compaction_error",
            "s",
            None,
            None,
        )
        assert "HTTP 500: stub failure" in failed.error  # what the endpoint said, as it said it
        assert session.get_message("t1") == text_message("t1", "first trigger")
        assert session.list_compactions() == []

        # The estimate stays high, so the next inserted append retries.
        llm.mode = "ok"
        assert session.append_message(text_message("t2", "second trigger")).inserted
        assert feed.until("compaction_error", "compact").type == "compact"
    assert len(llm.requests) == 2
    (record,) = session.list_compactions()
    assert record.summary == "summary #2"


def test_summarizer_timeout_never_fails_the_append_and_emits_compaction_error(
    summarizing: Summarizing, llm: ChatCompletionsStub
):
    llm.mode = HANG  # holds the request longer than the server's summarizer timeout
    session = _setup(summarizing, "slow")
    session.set_compaction_policy(1, keep_recent_tokens=1)
    with FeedReader(summarizing.address, "slow") as feed:
        assert session.append_message(text_message("t1", "trigger")).inserted
        failed = feed.until("compaction_error", "compact")
    assert failed.type == "compaction_error"
    assert "timed out" in failed.error.lower()
    assert len(llm.requests) == 1
    assert session.list_compactions() == []
    assert session.get_message("t1") is not None


def test_empty_automatic_summary_stores_nothing(summarizing: Summarizing, llm: ChatCompletionsStub):
    llm.mode = EMPTY
    session = _setup(summarizing, "blank")
    session.set_compaction_policy(1, keep_recent_tokens=1)
    session.append_message(text_message("t1", "trigger"))
    summarizing.stop()
    assert len(llm.requests) == 1
    assert compaction_rows(summarizing.data_dir, "blank") == []


def test_automatic_compaction_policy_survives_a_restart(summarizing: Summarizing, llm: ChatCompletionsStub):
    session = _setup(summarizing, "durable")
    message, tokens = trigger_message()
    session.set_compaction_policy(estimate(session) + tokens - 1, keep_recent_tokens=1)
    summarizing.restart()
    session = summarizing.client.object("durable").session()
    with FeedReader(summarizing.address, "durable") as feed:
        assert session.append_message(message).inserted
        assert feed.until("compact", "compaction_error").type == "compact"
    (record,) = session.list_compactions()
    assert (record.from_message_id, record.to_message_id) == ("m3", "m10")


def test_lone_surrogates_reach_the_model_escaped_and_come_back_as_u_fffd(
    summarizing: Summarizing, llm: ChatCompletionsStub
):
    """A text's lone surrogate and an emoji split by the prompt's 500-unit cut go to the model as
    upstream sends them (escaped in the request's JSON); PlanCompaction's prompt, a protobuf
    string, has U+FFFD there; a lone surrogate in the model's answer is stored as U+FFFD."""
    session = summarizing.client.object("surrogates").session()
    session.set_compaction_policy(0, keep_recent_tokens=1)
    odd = (
        '{"id":"m4","role":"user","parts":[{"type":"text","text":"x\\ud800y"},{"type":"dynamic-tool",'
        '"toolName":"t","toolCallId":"c","input":{"q":1},"output":"' + "b" * 498 + '\\ud83d\\ude00"}]}'
    )
    for i in range(12):
        session.append_message(odd if i == 4 else turn(i))
    llm.content = "summary \ud83d of the span"

    plan = session.plan_compaction(keep_recent_tokens=1)
    record = session.compact()

    (request,) = llm.requests
    assert "x\ud800y" in request.prompt and "b" * 497 + "\ud83d\n" in request.prompt
    assert plan is not None
    assert plan.prompt == request.prompt.replace("\ud800", "\ufffd").replace("\ud83d", "\ufffd")
    assert record is not None and record.summary == "summary \ufffd of the span"
    assert session.list_compactions() == [record]
