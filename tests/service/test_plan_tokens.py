"""A summary made on the client is stored only if what it was made of is unchanged since its plan
(beyond upstream): PlanCompaction returns a plan_token, and AddCompaction given it refuses the
record (FAILED_PRECONDITION, SESSION_CHANGED) after an update or delete of a message the plan
depends on, a clear, another record or the object erased; other edits keep it. A token is used
once and only by the server that made it (PLAN_EXPIRED), and `compact(summarize)` plans again
when its summary is refused. Without a token AddCompaction checks nothing, as upstream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client.admin import erase_object
from sessions_server.storage.paths import object_path
from sessions_server.transport.auth import hash_token
from tests.conftest import start_server
from tests.service.support import text_message
from tests.service.test_compaction_planning import append_turns, turn


def _planned(session: Any) -> Any:
    """Twelve turns m0..m11 and a plan of m3..m9 (the tail keeps m10 and m11)."""
    append_turns(session, 0, 12)
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m9")
    assert plan.plan_token
    return plan


def _add(session: Any, plan: Any, summary: str = "SUMMARY", **overrides: str) -> Any:
    span = {"from_message_id": plan.from_message_id, "to_message_id": plan.to_message_id, **overrides}
    return session.add_compaction(summary, span["from_message_id"], span["to_message_id"], plan_token=plan.plan_token)


def _refusal(session: Any, plan: Any, **overrides: str) -> SessionsError:
    with pytest.raises(SessionsError) as refused:
        _add(session, plan, **overrides)
    return refused.value


def _edit(message_id: str) -> dict[str, Any]:
    return text_message(message_id, f"corrected {message_id}")


def test_a_summary_of_an_unchanged_span_is_stored_once(session: Any) -> None:
    plan = _planned(session)
    record = _add(session, plan)
    assert (record.from_message_id, record.to_message_id, record.summary) == ("m3", "m9", "SUMMARY")
    again = _refusal(session, plan)  # used once: a repeat stores no second record
    assert (again.code, again.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PLAN_EXPIRED")
    assert "plan again" in again.message
    assert [r.id for r in session.list_compactions()] == [record.id]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.update_message(_edit("m5")), id="update-in-span"),
        pytest.param(lambda s: s.update_message(_edit("m3")), id="update-of-its-first"),
        pytest.param(lambda s: s.delete_messages(["m9"]), id="delete-of-its-last"),
        pytest.param(lambda s: s.clear_messages(), id="clear"),
        pytest.param(lambda s: s.add_compaction("OTHER", "m1", "m2"), id="another-record"),
    ],
)
def test_a_summary_whose_span_changed_since_its_plan_is_refused(session: Any, change: Any) -> None:
    plan = _planned(session)
    change(session)
    before = session.list_compactions()
    refused = _refusal(session, plan)
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SESSION_CHANGED")
    assert "nothing was stored" in refused.message
    assert session.list_compactions() == before
    used = _refusal(session, plan)  # the refusal used the token up
    assert used.reason == "PLAN_EXPIRED"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.update_message(_edit("m11")), id="update-of-the-newest"),
        pytest.param(lambda s: s.append_message(turn(12)), id="append"),
        pytest.param(lambda s: s.delete_messages(["m11", "nowhere"]), id="delete-past-the-span"),
        pytest.param(lambda s: s.update_message(text_message("o1", "edited")), id="another-sessions-message"),
    ],
)
def test_edits_outside_what_the_summary_depends_on_keep_it(obj: Any, change: Any) -> None:
    session = obj.session()
    plan = _planned(session)
    obj.session("other").append_message(text_message("o1"))
    change(session)
    record = _add(session, plan)
    assert [r.id for r in session.list_compactions()] == [record.id]
    assert [m["id"] for m in session.get_history()][:4] == ["m0", "m1", "m2", f"compaction_{record.id}"]


def test_without_a_token_a_stale_summary_is_stored_as_upstream_stores_it(session: Any) -> None:
    plan = _planned(session)
    session.update_message(_edit("m5"))
    record = session.add_compaction("STALE", plan.from_message_id, plan.to_message_id)
    assert record.summary == "STALE"


def test_a_token_given_with_another_span_or_session_is_refused_and_kept(obj: Any) -> None:
    session = obj.session()
    plan = _planned(session)
    other_span = _refusal(session, plan, to_message_id="m8")
    assert (other_span.code, other_span.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert "'m3' to 'm9'" in other_span.message
    other_session = obj.session("other")
    mismatched = _refusal(other_session, plan)
    assert mismatched.code == grpc.StatusCode.INVALID_ARGUMENT and "another object or session" in mismatched.message
    assert other_session.list_compactions() == [] == session.list_compactions()
    assert _add(session, plan).to_message_id == "m9"  # bad input changed nothing: the token still works


def test_an_unknown_or_malformed_token_is_refused_with_nothing_stored(session: Any) -> None:
    plan = _planned(session)
    with pytest.raises(SessionsError) as unknown:
        session.add_compaction("S", "m3", "m9", plan_token="cpt1_" + "A" * 22)
    assert (unknown.value.code, unknown.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PLAN_EXPIRED")
    for malformed in ("x" * 65, "cpt1_short", plan.plan_token + "=", plan.plan_token[:-1] + "!"):
        with pytest.raises(SessionsError) as refused:
            session.add_compaction("S", "m3", "m9", plan_token=malformed)
        assert (refused.value.code, refused.value.metadata.get("field")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "plan_token",
        ), malformed
    assert session.list_compactions() == []
    assert _add(session, plan).summary == "SUMMARY"  # none of them was taken for the plan's


def test_a_token_outlives_no_restart_of_its_server(tmp_path: Path) -> None:
    """A plan is held in the server's memory: after a restart its token is unknown, and the
    summary is refused, not stored unchecked."""
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with SessionsClient(server.address) as client:
            plan = _planned(client.object("k").session())
    finally:
        server.stop()
    server = start_server(data)
    try:
        with SessionsClient(server.address) as client:
            session = client.object("k").session()
            assert _refusal(session, plan).reason == "PLAN_EXPIRED"
            assert session.list_compactions() == []
    finally:
        server.stop()


def test_a_summary_of_an_erased_object_is_refused_and_creates_no_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with SessionsClient(server.address) as client:
            session = client.object("gone").session()
            plan = _planned(session)
            assert erase_object(client, "gone")
            assert _refusal(session, plan).reason == "SESSION_CHANGED"
            assert not object_path(data, "gone").exists()
    finally:
        server.stop()


def test_compact_with_a_summarizer_summarizes_again_when_its_span_changed_meanwhile(obj: Any) -> None:
    session = obj.session()
    append_turns(session, 0, 12)
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        if len(prompts) == 1:
            session.update_message(text_message("m5", "corrected while summarizing"))
        return f"SUMMARY-{len(prompts)}"

    record = session.compact(summarize, keep_recent_tokens=1)
    assert record is not None and record.summary == "SUMMARY-2"
    assert "corrected while summarizing" not in prompts[0] and "corrected while summarizing" in prompts[1]
    assert [r.summary for r in session.list_compactions()] == ["SUMMARY-2"]


def test_compact_with_a_summarizer_outrun_every_time_stores_nothing(obj: Any) -> None:
    session = obj.session()
    append_turns(session, 0, 12)
    calls: list[str] = []

    def summarize(prompt: str) -> str:
        calls.append(prompt)
        session.update_message(text_message("m5", f"edit {len(calls)}"))
        return "SUMMARY"

    with pytest.raises(SessionsError) as refused:
        session.compact(summarize, keep_recent_tokens=1)
    assert refused.value.reason == "SESSION_CHANGED" and len(calls) == 3
    assert session.list_compactions() == []


def test_an_add_its_caller_cancelled_has_used_its_token(tmp_path: Path) -> None:
    """A cancelled AddCompaction put its token back, though its queued write could still commit:
    a repeat was then told SESSION_CHANGED, "nothing was stored", beside the stored record. The
    token is now used (PLAN_EXPIRED), however far the call got before its cancel."""
    server = start_server(tmp_path / "data")
    compactor = server.running.service.compactor
    try:
        with SessionsClient(server.address) as client:
            for steps in range(1, 9):  # how many turns the call runs before its cancel (1: up to its first wait)
                key = f"k{steps}"
                session = client.object(key).session()
                plan = _planned(session)
                before = len(session.list_compactions())

                async def cancelled(plan: Any = plan, steps: int = steps, key: str = key) -> None:
                    span = (plan.from_message_id, plan.to_message_id)
                    call = asyncio.ensure_future(compactor.add(key, "", "S", *span, plan_token=plan.plan_token))
                    for _ in range(steps):
                        await asyncio.sleep(0)  # one turn of the loop, no waiting
                    call.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await call

                asyncio.run_coroutine_threadsafe(cancelled(), server.loop).result(timeout=30)
                assert _refusal(session, plan).reason == "PLAN_EXPIRED", steps
                assert len(session.list_compactions()) - before <= 1
    finally:
        server.stop()


def test_a_plan_for_a_read_only_token_is_not_held(tmp_path: Path) -> None:
    """A reader could not store the summary, and its plans, held, would crowd out the writers'
    (a reader's 1,025 plans let every writer's go): it gets its plan without a token."""
    tokens = tmp_path / "tokens.json"
    grants = [
        {"name": "writer", "sha256": hash_token("w-secret"), "prefixes": ["tenant-a/"], "access": "write"},
        {"name": "reader", "sha256": hash_token("r-secret"), "prefixes": ["tenant-a/"], "access": "read"},
    ]
    tokens.write_text(json.dumps({"tokens": grants}))
    server = start_server(tmp_path / "data", tokens_file=tokens)
    held = server.running.service.compactor.held_plans
    try:
        with (
            SessionsClient(server.address, token="w-secret") as writer,
            SessionsClient(server.address, token="r-secret") as reader,
        ):
            plan = _planned(writer.object("tenant-a/chat").session())
            read = reader.object("tenant-a/chat").session().plan_compaction(keep_recent_tokens=1)
            assert read == plan and read is not None and read.plan_token == ""
            assert len(held) == 1
            assert _add(writer.object("tenant-a/chat").session(), plan).summary == "SUMMARY"
    finally:
        server.stop()
