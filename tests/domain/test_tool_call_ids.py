"""Compaction planning keeps a tool call and its results together, matching a result to a call
by id as upstream's JavaScript `Set` does: `true` is not `1` there (Python's `True == 1` made a
result with id `true` answer a call with id `1`), `1` and `1.0` are one number, and ids that
are objects never match across messages."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_server.domain import compaction


def _facts(call_id: Any, result_id: Any) -> list[compaction.MessageFacts]:
    def message(message_id: str, role: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": message_id, "role": role, "parts": parts}

    text = [{"type": "text", "text": "words"}]
    history = [
        message("a", "user", text),
        message("b", "user", text),
        message("c", "assistant", [{"type": "tool-search", "toolCallId": call_id}]),
        message("d", "tool", [{"type": "tool-search", "toolCallId": result_id}]),
        message("e", "user", text),
        message("f", "user", text),
        message("g", "user", text),
    ]
    return [compaction.message_facts(m) for m in history]


@pytest.mark.parametrize(
    ("call_id", "result_id", "answers"),
    [
        ("call-1", "call-1", True),
        (1, 1.0, True),
        (None, None, True),
        (1, True, False),
        (True, 1, False),
        (0, False, False),
        ("1", 1, False),
        ({"k": 1}, {"k": 1}, False),
    ],
)
def test_a_result_answers_the_call_before_it_by_id(call_id: Any, result_id: Any, answers: bool) -> None:
    plan = compaction.plan_span(_facts(call_id, result_id), [], keep_recent_tokens=1)
    assert plan is not None
    # The head keeps three messages, and with them the results of a call among them.
    assert plan.from_message_id == ("e" if answers else "d")
