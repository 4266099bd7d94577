"""Compaction planning (issue 6): PlanCompaction runs upstream's `createCompactFunction`
(reference notes §7 and §12 "createCompactFunction") and the client's `compact(summarize=fn)`
plans, calls the function and stores the overlay, with `compact()`'s iterative extension and our
deliberate difference (DESIGN.md §9): a span never covers a message its summary did not include.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from tests.service.support import text_message

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu")

SECTIONS = """## Topic
[What the conversation is about]

## Key Points
[Important information, decisions, and conclusions from the conversation]

## Current State
[Where things stand now — what has been done, what is in progress]

## Open Items
[Unresolved questions, pending tasks, or next steps discussed]

Target ~{budget} tokens. Be factual — only include information that was explicitly discussed in the \
conversation. Do NOT invent file paths, commands, or details that were not mentioned. Write only the summary body."""


def first_prompt(content: str, budget: int) -> str:
    """Upstream's first-compaction template (compaction-helpers.ts, buildSummaryPrompt)."""
    return (
        "Create a concise summary of this conversation that preserves the important information for future "
        f"context.\n\nCONVERSATION TO SUMMARIZE:\n{content}\n\nUse this structure:\n\n" + SECTIONS.format(budget=budget)
    )


def update_prompt(previous: str, content: str, budget: int) -> str:
    """Upstream's update template."""
    return (
        "You are updating a conversation summary. A previous summary exists below. New conversation turns have "
        f"occurred since then and need to be incorporated.\n\nPREVIOUS SUMMARY:\n{previous}\n\n"
        f"NEW TURNS TO INCORPORATE:\n{content}\n\nUpdate the summary. PRESERVE existing information that is "
        "still relevant. ADD new information. Remove information only if it is clearly obsolete.\n\n"
        + SECTIONS.format(budget=budget)
    )


def string_tokens(text: str) -> int:
    return 0 if not text else math.ceil(max(len(text) / 4, len(text.split()) * 1.3))


def message_tokens(message: dict[str, Any]) -> int:
    return 4 + sum(string_tokens(p["text"]) for p in message["parts"] if p["type"] == "text")


def render(message: dict[str, Any]) -> str:
    text = "\n".join(p["text"] for p in message["parts"] if p["type"] == "text")
    return f"[{message['role']}]\n{text}"


def turn(index: int, words: int = 30) -> dict[str, Any]:
    body = " ".join(WORDS[(index + k) % len(WORDS)] for k in range(words))
    return text_message(f"m{index}", f"turn-{index:02d} {body}", role="user" if index % 2 == 0 else "assistant")


def append_turns(session: Any, start: int, count: int, words: int = 30) -> list[dict[str, Any]]:
    messages = [turn(i, words) for i in range(start, start + count)]
    session.append_messages(messages)
    return messages


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


class Recorder:
    """A summarize function that records its prompts."""

    def __init__(self, answer: str = "SUMMARY") -> None:
        self.answer = answer
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.answer


# ── createCompactFunction ───────────────────────────────────────────────────


def test_five_messages_give_no_plan_and_the_model_is_not_called(session: Any):
    append_turns(session, 0, 5)
    assert session.plan_compaction(keep_recent_tokens=1) is None
    summarize = Recorder()
    assert session.compact(summarize, keep_recent_tokens=1) is None
    assert summarize.prompts == []
    assert session.list_compactions() == []


def test_small_conversation_within_the_default_keep_recent_budget_gives_no_plan(session: Any):
    append_turns(session, 0, 12)
    assert session.plan_compaction() is None  # everything after the head fits 20,000 tokens


def test_twelve_messages_keep_recent_one(session: Any):
    messages = append_turns(session, 0, 12)
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None
    assert plan.from_message_id == "m3"
    assert plan.to_message_id != "m11"
    assert plan.to_message_id == "m9"  # the tail keeps at least two messages
    assert "turn-03" in plan.prompt
    assert "turn-11" not in plan.prompt
    middle = messages[3:10]
    budget = max(100, math.floor(0.2 * sum(message_tokens(m) for m in middle)))
    assert plan.budget_tokens == budget
    assert plan.prompt == first_prompt("\n\n---\n\n".join(render(m) for m in middle), budget)


def test_a_plan_without_a_budget_keeps_the_tail_the_sessions_policy_names(session: Any):
    """The stored policy's keep_recent_tokens was ignored: a plan kept 20,000 tokens whatever
    SetCompactionPolicy stored, though a server without a summarizer points users there."""
    append_turns(session, 0, 12)
    assert session.plan_compaction() is None  # the default tail holds everything
    session.set_compaction_policy(0, keep_recent_tokens=1)
    assert session.plan_compaction() == session.plan_compaction(keep_recent_tokens=1) is not None
    assert session.plan_compaction(keep_recent_tokens=20_000) is None  # a request's own budget wins


def test_keep_recent_tokens_sizes_the_tail(session: Any):
    messages = append_turns(session, 0, 12)
    three = sum(message_tokens(m) for m in messages[9:12])
    plan = session.plan_compaction(keep_recent_tokens=three)  # the last three fit exactly
    assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m8")
    plan = session.plan_compaction(keep_recent_tokens=three - 1)
    assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m9")


def test_budget_floor_is_100_tokens(session: Any):
    session.append_messages([text_message(f"s{i}", "hi") for i in range(8)])
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None and plan.budget_tokens == 100
    assert "Target ~100 tokens." in plan.prompt


def test_plan_follows_the_leaf_given(session: Any):
    append_turns(session, 0, 4)
    session.append_messages([text_message(f"b{i}", f"branch {i}") for i in range(6)], parent_id="m1")
    append_turns(session, 4, 1)  # m4 under b5: the active leaf
    plan = session.plan_compaction(leaf_id="b5", keep_recent_tokens=1)
    assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("b1", "b3")
    assert session.plan_compaction(leaf_id="unknown", keep_recent_tokens=1) is None


def test_negative_keep_recent_tokens_is_invalid(session: Any):
    append_turns(session, 0, 8)
    with pytest.raises(SessionsError) as caught:
        session.plan_compaction(keep_recent_tokens=-1)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_previous_overlay_enters_the_prompt_but_never_becomes_from_or_to(session: Any):
    messages = append_turns(session, 0, 12)
    previous = session.add_compaction("PREVIOUS SUMMARY BODY", "m3", "m5")
    # history: m0 m1 m2 C m6 m7 m8 m9 m10 m11
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None
    assert not plan.from_message_id.startswith("compaction_")
    assert not plan.to_message_id.startswith("compaction_")
    assert plan.to_message_id == "m9"
    assert plan.from_message_id == "m3"  # extends the visible overlay rather than stacking
    middle = messages[6:10]
    budget = max(100, math.floor(0.2 * sum(message_tokens(m) for m in middle)))
    assert plan.prompt == update_prompt(previous.summary, "\n\n---\n\n".join(render(m) for m in middle), budget)

    record = session.compact(Recorder("NEW"), keep_recent_tokens=1)
    assert record is not None and (record.from_message_id, record.to_message_id) == ("m3", "m9")
    assert ids(session.get_history()) == ["m0", "m1", "m2", "compaction_" + record.id, "m10", "m11"]


@pytest.mark.parametrize("blank", [" \n\t ", "\ufeff\u3000"])
def test_whitespace_summary_stores_nothing(session: Any, blank: str):
    """Blank as JavaScript's trim() sees it, as upstream's createCompactFunction tests it."""
    append_turns(session, 0, 12)
    summarize = Recorder(blank)
    assert session.compact(summarize, keep_recent_tokens=1) is None
    assert len(summarize.prompts) == 1
    assert session.list_compactions() == []


def test_a_summarizer_answer_that_is_no_string_is_a_type_error_storing_nothing(session: Any):
    """It was an AttributeError of `strip`; TypeScript's client says the same as this now."""
    append_turns(session, 0, 12)
    with pytest.raises(TypeError, match="summarize returned dict, not a string"):
        session.compact(lambda prompt: {"summary": "x"}, keep_recent_tokens=1)
    assert session.list_compactions() == []


def test_a_summary_javascript_does_not_trim_away_is_stored(session: Any):
    """Python's strip() removes U+0085, which JavaScript's trim() keeps."""
    append_turns(session, 0, 12)
    assert session.compact(Recorder("\x85"), keep_recent_tokens=1) is not None
    assert [record.summary for record in session.list_compactions()] == ["\x85"]


def _tool_call(message_id: str, call_id: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "role": "assistant",
        "parts": [
            {"type": "text", "text": f"calling from {message_id}"},
            {"type": "tool-x", "toolCallId": call_id, "state": "input-available", "input": {"q": message_id}},
        ],
    }


def _tool_result(message_id: str, call_id: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "role": "tool",
        "parts": [{"type": "tool-x", "toolCallId": call_id, "state": "output-available", "output": {"r": message_id}}],
    }


def test_tool_call_and_result_are_not_split_at_the_tail(session: Any):
    # The plain cut would fall between m9 (call) and m10 (its result).
    session.append_messages([turn(i) for i in range(9)])
    session.append_messages([_tool_call("m9", "c1"), _tool_result("m10", "c1"), turn(11)])
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m3", "m8")
    assert "calling from m9" not in plan.prompt


def test_tool_call_and_result_are_not_split_at_the_head(session: Any):
    # The head ends after m2 (a call); its result m3 stays with it.
    session.append_messages([turn(0), turn(1), _tool_call("m2", "c7"), _tool_result("m3", "c7")])
    session.append_messages([turn(i) for i in range(4, 12)])
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("m4", "m9")


def test_tool_parts_render_in_the_prompt(session: Any):
    session.append_messages([turn(i) for i in range(3)])
    long_input = {"text": "x" * 600}
    session.append_messages(
        [
            {
                "id": "m3",
                "role": "assistant",
                "parts": [
                    {"type": "text", "text": "using tools"},
                    {"type": "tool-lookup", "toolCallId": "a", "input": {"q": 1}, "output": {"hits": 2}},
                    {"type": "dynamic-tool", "toolName": "search", "toolCallId": "b", "input": long_input},
                ],
            },
            {"id": "m4", "role": "tool", "parts": [{"type": "tool-lookup", "toolCallId": "a", "output": "ok"}]},
        ]
    )
    session.append_messages([turn(i) for i in range(5, 9)])
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None
    long_json = '{"text":"' + "x" * 600 + '"}'
    assert (
        '[assistant]\nusing tools\n[Tool: unknown]\nInput: {"q":1}\nOutput: {"hits":2}\n'
        f'[Tool: search]\nInput: {long_json[:500]}\n\n---\n\n[tool]\n\n[Tool: unknown]\nOutput: "ok"'
    ) in plan.prompt


# ── compact(summarize=fn) and iterative compaction ──────────────────────────


def test_compact_with_a_function_stores_the_plan_and_the_summary(session: Any):
    append_turns(session, 0, 12)
    plan = session.plan_compaction(keep_recent_tokens=1)
    summarize = Recorder("first summary")
    record = session.compact(summarize, keep_recent_tokens=1)
    assert summarize.prompts == [plan.prompt]
    assert record is not None
    assert (record.summary, record.from_message_id, record.to_message_id) == ("first summary", "m3", "m9")
    assert session.list_compactions() == [record]


def test_iterative_compaction_extends_the_first_span(session: Any):
    append_turns(session, 0, 12)
    first = session.compact(Recorder("SUMMARY ONE"), keep_recent_tokens=1)
    assert first is not None and (first.from_message_id, first.to_message_id) == ("m3", "m9")
    assert ids(session.get_history()) == ["m0", "m1", "m2", "compaction_" + first.id, "m10", "m11"]

    messages = append_turns(session, 12, 4)
    summarize = Recorder("SUMMARY TWO")
    second = session.compact(summarize, keep_recent_tokens=1)
    assert second is not None and (second.from_message_id, second.to_message_id) == ("m3", "m13")
    middle = [turn(10), turn(11), *messages[:2]]
    budget = max(100, math.floor(0.2 * sum(message_tokens(m) for m in middle)))
    assert summarize.prompts == [update_prompt("SUMMARY ONE", "\n\n---\n\n".join(render(m) for m in middle), budget)]
    assert ids(session.get_history()) == ["m0", "m1", "m2", "compaction_" + second.id, "m14", "m15"]
    assert [r.id for r in session.list_compactions()] == [first.id, second.id]


@pytest.mark.parametrize(("span_from", "span_to"), [("m1", "m2"), ("m0", "m1"), ("m2", "m2"), ("m1", "m1")])
def test_a_span_never_covers_a_message_its_summary_did_not_include(session: Any, span_from: str, span_to: str):
    """Deliberate difference (DESIGN.md §9): with an earlier overlay inside the protected head,
    upstream extends the new span back to that overlay's start, dropping the head messages after
    it without summarizing them."""
    messages = append_turns(session, 0, 12)
    text = {m["id"]: m["parts"][0]["text"] for m in messages}
    raw = list(text)
    early = session.add_compaction("EARLY SUMMARY", span_from, span_to)
    early_span = raw[raw.index(span_from) : raw.index(span_to) + 1]

    summarize = Recorder("LATER SUMMARY")
    record = session.compact(summarize, keep_recent_tokens=1)
    assert record is not None
    (prompt,) = summarize.prompts
    assert record.from_message_id == span_from  # the visible overlay is extended
    history = [m["id"] for m in session.get_history()]
    assert "compaction_" + record.id in history
    assert "compaction_" + early.id not in history
    missing = [i for i in raw if i not in history]
    assert missing
    for message_id in missing:
        covered_by_previous = message_id in early_span and "EARLY SUMMARY" in prompt
        assert text[message_id] in prompt or covered_by_previous, message_id


# ── prompts larger than a response ──────────────────────────────────────────


def test_a_prompt_just_under_a_response_is_planned(session: Any):
    # Five middle messages of 560,000 characters: a prompt of about 2.8 MB, under the 3 MiB budget.
    session.append_messages([text_message(f"b{i}", "a" * 560_000) for i in range(10)])
    plan = session.plan_compaction(keep_recent_tokens=1)
    assert plan is not None and (plan.from_message_id, plan.to_message_id) == ("b3", "b7")
    assert 2_800_000 < len(plan.prompt) < 3 * 1024 * 1024


def test_a_prompt_larger_than_a_response_is_refused_by_name(session: Any):
    # The same with 900,000 characters each: about 4.5 MB of prompt, past the response budget and
    # the server's 4 MiB send limit, which alone answered a RESOURCE_EXHAUSTED naming no limit.
    session.append_messages([text_message(f"b{i}", "a" * 900_000) for i in range(10)])
    with pytest.raises(SessionsError) as caught:
        session.plan_compaction(keep_recent_tokens=1)

    error = caught.value
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.reason == "LIMIT_EXCEEDED"
    assert error.metadata["limit"] == "max_response_bytes"
    assert int(error.metadata["limit_value"]) == 3 * 1024 * 1024
    assert "AddCompaction" in error.message and "prompt" in error.message
    # The way out it names: a summary recorded for part of the span.
    record = session.add_compaction("the first two of the middle", "b3", "b4")
    assert (record.from_message_id, record.to_message_id) == ("b3", "b4")
