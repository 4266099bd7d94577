"""Compaction records, overlay planning in every read, and compact() with upstream's
createCompactFunction (reference notes §7). Record ids are random on both sides: reads name an
overlay by session and record seq instead (see `overlay_names`)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conformance.harness.messages import msg
from tests.conformance.harness.pair import Pair


def _chain(pair: Pair, n: int, prefix: str = "m", session: str = "") -> None:
    for i in range(n):
        pair.append(msg(f"{prefix}{i}", f"turn {i} " + "words " * (i % 4)), session=session, check=False)


def test_basic_overlay(pair: Pair) -> None:
    _chain(pair, 6)
    pair.add_compaction("summary of m1..m3", "m1", "m3")
    pair.append(msg("m6"))
    ids = [m.split('"id":"')[1].split('"')[0] for m in pair.read("getHistory")]
    assert ids == ["m0", "compaction_<#1>", "m4", "m5", "m6"], ids


def test_planning_rules(pair: Pair) -> None:
    _chain(pair, 10)
    pair.add_compaction("A m2..m4", "m2", "m4", check=False)
    pair.add_compaction("B inside A, extends beyond", "m3", "m6", check=False)  # ignored entirely
    pair.add_compaction("C same start, shorter, newer", "m2", "m3")  # supersedes A
    pair.add_compaction("D one row", "m8", "m8")
    pair.add_compaction("E reversed", "m7", "m5")
    pair.add_compaction("F unknown ends", "zz", "m9")
    pair.add_compaction("G outer swallows", "m1", "m7")


def test_overlays_on_branches(pair: Pair) -> None:
    _chain(pair, 5)
    pair.append(msg("b3"), parent="m2", check=False)
    pair.append(msg("b4"), check=False)
    pair.add_compaction("on the branch", "m1", "b3")
    pair.add_compaction("on the main line", "m3", "m4")
    pair.add_compaction("across branches", "b3", "m4")


def test_recent_history_window_cuts_overlay(pair: Pair) -> None:
    _chain(pair, 8)
    pair.add_compaction("early span", "m1", "m5")
    pair.add_compaction("late span", "m6", "m6")
    for budget in (1, 200, 400, 600, 10**6):
        pair.read("getRecentHistory", {"maxContentBytes": budget})


def test_newest_first_with_overlays_and_long_prefix(pair: Pair) -> None:
    _chain(pair, 30)
    pair.add_compaction("mid", "m10", "m12", check=False)
    pair.add_compaction("late", "m20", "m25")
    pair.read("getHistory", {"options": {"newestFirst": True}})
    pair.read("historyBatches", {"options": {"newestFirst": True, "batchSize": 4}})


def test_deletes_and_clear_with_compactions(pair: Pair) -> None:
    _chain(pair, 6)
    pair.add_compaction("span", "m1", "m3")
    pair.delete(["m2"])  # inside the span: still applies
    pair.delete(["m3"])  # its `to` is gone: stops applying, the record stays
    pair.clear()  # removes the records too
    pair.append(msg("n"))


def test_compactions_per_session(pair: Pair) -> None:
    _chain(pair, 4, session="s1")
    _chain(pair, 4, session="s2")
    pair.add_compaction("s1 span", "m0", "m2", session="s1")
    pair.add_compaction("s2 span", "m1", "m1", session="s2")
    pair.add_compaction("default has no rows", "m0", "m2")


def test_compact_too_short_returns_null(pair: Pair) -> None:
    _chain(pair, 5)
    pair.compact_reference(keep_recent_tokens=1)


def test_compact_iterative(pair: Pair) -> None:
    """12 messages, keepRecentTokens 1: the first compact covers m3..m9; after 4 more appends the
    second extends from the visible overlay's start and uses the update template."""
    _chain(pair, 12)
    first, _ = pair.compact_reference(keep_recent_tokens=1)
    assert first.value["result"]["from"] == "m3", first.value
    _chain(pair, 4, prefix="n")
    second, _ = pair.compact_reference(keep_recent_tokens=1)
    assert second.value["result"]["from"] == "m3" and second.value["result"]["to"] != first.value["result"]["to"]
    assert "PREVIOUS SUMMARY" in second.value["prompt"]
    pair.compact_reference(keep_recent_tokens=1)


def test_compact_keep_recent_budget_and_leaf(pair: Pair) -> None:
    _chain(pair, 14)
    pair.append(msg("side"), parent="m8", check=False)
    pair.compact_reference(keep_recent_tokens=40, leaf="m13")
    pair.compact_reference(keep_recent_tokens=20_000)


def _tool_turns(pair: Pair) -> None:
    parts: list[dict[str, Any]] = []
    for i in range(3):
        pair.append(msg(f"u{i}", f"question {i}", role="user"), check=False)
    parts = [
        {"type": "text", "text": "calling tools"},
        {
            "type": "tool-search",
            "toolCallId": "call-1",
            "state": "output-available",
            "input": {"q": "x" * 600},
            "output": "y" * 700,
        },
        {"type": "dynamic-tool", "toolName": "calc", "toolCallId": "call-2", "input": {"a": 1}, "output": {"r": 2}},
    ]
    pair.append({"id": "a-tools", "role": "assistant", "parts": parts}, check=False)
    pair.append(
        {"id": "t-result", "role": "tool", "parts": [{"type": "tool-search", "toolCallId": "call-1", "output": "z"}]},
        check=False,
    )
    for i in range(6):
        pair.append(msg(f"v{i}", f"later {i}"), check=False)


def test_compact_tool_alignment(pair: Pair) -> None:
    _tool_turns(pair)
    up, _ = pair.compact_reference(keep_recent_tokens=1)
    assert up.value["result"] is not None and "[Tool: " in up.value["prompt"]


def test_span_never_covers_unsummarized_message(pair: Pair) -> None:
    """DESIGN §9 (deliberate): with an earlier overlay inside the protected head, upstream's
    compact() extends the new span back to that overlay's start and so hides m2, which the
    summary never saw. Ours must either keep m2 visible or have it in the summarized prompt."""
    _chain(pair, 12)
    pair.add_compaction("early", "m1", "m1")
    up = pair.up("compact", {"mode": "reference", "keepRecentTokens": 1})
    assert (up["result"]["fromMessageId"], up["result"]["toMessageId"]) == ("m1", "m9")
    assert "turn 2 " not in up["prompt"]
    assert "m2" not in [m["id"] for m in pair.up("getHistory", {})]

    ours = pair.ours()
    plan = ours.plan_compaction(keep_recent_tokens=1)
    assert plan is not None
    ours.compact(lambda prompt: "S", keep_recent_tokens=1)
    visible = [m["id"] for m in ours.get_history()]
    assert "m2" in visible or "turn 2 " in plan.prompt, (
        f"ours hides m2 without summarizing it: plan {plan.from_message_id}..{plan.to_message_id}, history {visible}"
    )


def test_compact_after_manual_records_extends_only_the_summaries_it_hides(pair: Pair) -> None:
    """LATER sits after the span's last raw message (m6), before the recent tail: the new record
    leaves it visible, so its summary is no previous summary (upstream's prompt holds FIRST
    only; ours held FIRST and LATER, and LATER was then both visible and in the new summary)."""
    for i in range(10):
        pair.append(msg(f"m{i}", f"turn {i}"), check=False)
    pair.add_compaction("FIRST", "m3", "m4", check=False)
    pair.add_compaction("LATER", "m7", "m7")
    up, _ = pair.compact_reference(keep_recent_tokens=1)  # compares the prompts, records and reads
    assert (up.value["result"]["from"], up.value["result"]["to"]) == ("m3", "m6"), up.value
    assert "PREVIOUS SUMMARY:\nFIRST\n\nNEW TURNS" in up.value["prompt"]


def test_lone_surrogates_in_the_span_reach_the_plan_as_u_fffd(pair: Pair) -> None:
    """Deliberate (README): upstream's prompt holds a text's lone surrogate, and the high half of
    an emoji that the 500-unit cut of a tool output splits. Ours plans the same prompt (the
    server's own summarizer gets exactly it, escaped in the request's JSON; see
    tests/service/test_compaction_summarizer.py), but PlanCompaction's prompt, a protobuf
    string, carries U+FFFD in their place; the span and the summary's length are the same."""
    extra = (
        '{"type":"text","text":"x\\ud800y"},'
        '{"type":"dynamic-tool","toolName":"t","toolCallId":"c","input":{"q":1},"output":"'
        + "b" * 498
        + '\\ud83d\\ude00"}'
    )
    for i in range(8):
        parts = '{"type":"text","text":"turn ' + str(i) + ' text"}' + ("," + extra if i == 4 else "")
        text = '{"id":"m' + str(i) + '","role":"user","parts":[' + parts + "]}"
        pair.up("appendMessage", {"message": json.loads(text)})
        pair.ours().append_message(text)

    upstream = pair.up("compact", {"mode": "reference", "keepRecentTokens": 1})
    plan = pair.ours().plan_compaction(keep_recent_tokens=1)

    assert "x\ud800y" in upstream["prompt"] and "b" * 497 + "\ud83d" in upstream["prompt"]
    assert plan is not None
    assert plan.prompt == re.sub("[\ud800-\udfff]", "\ufffd", upstream["prompt"])
    assert (plan.from_message_id, plan.to_message_id) == (
        upstream["result"]["fromMessageId"],
        upstream["result"]["toMessageId"],
    )


def test_newest_first_walks_through_a_hidden_row_that_ends_a_compaction(pair: Pair) -> None:
    """README (deliberate): a compaction ending at a hidden row (an echoed summary) draws no
    overlay; upstream's newest-first walk stops at that row with nothing older, ours goes on,
    the root-first order reversed, as a remembered path always did."""
    ours = pair.ours()
    for side_append in (lambda m: pair.up("appendMessage", {"message": m}), ours.append_message):
        side_append(msg("a", "first"))
    up_record = pair.up("addCompaction", {"summary": "s", "fromMessageId": "none", "toMessageId": "none"})["id"]
    our_record = ours.add_compaction("s", "none", "none").id
    echo = {"parentId": "a", "createdAt": 1}
    pair.up("importMessage", {"message": msg("compaction_" + up_record, "echoed"), "options": echo})
    ours.import_message(msg("compaction_" + our_record, "echoed"), parent_id="a", created_at=1)
    pair.up("addCompaction", {"summary": "t", "fromMessageId": "none", "toMessageId": "compaction_" + up_record})
    ours.add_compaction("t", "none", "compaction_" + our_record)

    def ids(messages: Any) -> list[str]:
        return [m["id"] for m in messages]

    assert ids(pair.up("getHistory", {"options": {"newestFirst": True}})) == []
    assert ids(ours.get_history(newest_first=True)) == ["a"]  # before a root-first read remembers the path
    assert ids(pair.up("getHistory", {})) == ["a"] == ids(ours.get_history())
