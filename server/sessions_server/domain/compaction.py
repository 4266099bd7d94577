"""Compaction planning: which span of a history a summary replaces, and the summarizer prompt.

Follows upstream's reference compaction (`createCompactFunction`, reference notes §7): keep the
first 3 messages and a recent tail (at least 2 messages, and as many as fit `keep_recent_tokens`),
never split a tool call from its result, summarize the middle, and extend an existing visible
overlay instead of stacking a second one. The prompt templates are reproduced exactly, since a
summarizer's input is behaviour clients compare.

One deliberate difference (DESIGN.md §9): upstream extends the new span back to an older overlay's
start even when messages between that overlay and the middle were never summarized (an overlay
inside the protected head), which drops them from history. Here the middle grows back to the
span's start, so every message the span covers is in the summary or in the previous summary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessions_server.domain import jsjson
from sessions_server.domain.messages import js_string
from sessions_server.domain.overlays import SpanRecord
from sessions_server.domain.tokens import estimate_message_tokens
from sessions_server.storage.rows import COMPACTION_PREFIX

PROTECT_HEAD = 3
MIN_TAIL_MESSAGES = 2
DEFAULT_KEEP_RECENT_TOKENS = 20_000
TOOL_TEXT_LIMIT_UTF16 = 500

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """The span a summary will replace and the prompt that asks for it; `depends_on` as the
    span's (`SpanPlan`)."""

    from_message_id: str
    to_message_id: str
    prompt: str
    budget_tokens: int
    depends_on: frozenset[str]


def _is_tool_part(part: Any) -> bool:
    kind = part.get("type") if isinstance(part, dict) else None
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


@dataclass(slots=True)
class MessageFacts:
    """What planning needs of one history message, without the message: a long history is
    planned from these, and only the span to summarize is read again, to render the prompt.

    Call ids that are not strings, numbers, booleans or null are left out: upstream compares
    them by identity, and no two messages share a parsed object. The others are told apart as a
    JavaScript `Set` tells them (`_call_key`).

    An overlay a read made of a record keeps the record's id, not its summary (3 MiB each at
    most, and a history may show many): the summaries the prompt needs are read again by id. A
    stored row whose id merely looks like an overlay's keeps its text."""

    id: str
    tokens: int
    overlay: bool
    calls: frozenset[Any] | None  # an assistant message with tool calls: the ids it calls
    answers: frozenset[Any]  # the call ids its tool parts carry
    summary: str | None  # an overlay's text, unless it is a record's (`record_id`)
    record_id: str | None = None  # the record an overlay of the read was made of


def message_facts(message: Message, *, of_record: bool = False) -> MessageFacts:
    """`of_record`: the message is an overlay a read made of a record (its summary, the
    message's text, is then left to be read by the record's id)."""
    tool_parts = [part for part in message.get("parts", ()) if _is_tool_part(part)]
    answers = frozenset(
        _call_key(part["toolCallId"]) for part in tool_parts if "toolCallId" in part and _comparable(part["toolCallId"])
    )
    overlay = is_overlay_message(message)
    message_id = str(message.get("id"))
    record_id = message_id[len(COMPACTION_PREFIX) :] if overlay and of_record else None
    return MessageFacts(
        id=message_id,
        tokens=estimate_message_tokens([message]),
        overlay=overlay,
        calls=answers if tool_parts and message.get("role") == "assistant" else None,
        answers=answers,
        summary=_text_of(message, "\n") if overlay and record_id is None else None,
        record_id=record_id,
    )


def _comparable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool | type(None))


def _call_key(value: Any) -> tuple[bool, Any]:
    """A call id as a JavaScript `Set` tells them apart: there `true` is not `1` (in Python,
    `True == 1`), while `1` and `1.0` are one number in both."""
    return isinstance(value, bool), value


def _answers(message: MessageFacts, caller: MessageFacts) -> bool:
    return caller.calls is not None and not message.answers.isdisjoint(caller.calls)


def _align_forward(messages: Sequence[MessageFacts], index: int) -> int:
    if index <= 0 or index >= len(messages):
        return index
    previous = messages[index - 1]
    while index < len(messages) and _answers(messages[index], previous):
        index += 1
    return index


def _align_backward(messages: Sequence[MessageFacts], index: int) -> int:
    if index <= 0 or index >= len(messages):
        return index
    while index > 0 and messages[index].calls is None and _answers(messages[index], messages[index - 1]):
        index -= 1
    return index


def _tail_cut(messages: Sequence[MessageFacts], head_end: int, keep_recent_tokens: int) -> int:
    count = len(messages)
    accumulated = 0
    token_cut = count
    for index in range(count - 1, head_end - 1, -1):
        tokens = messages[index].tokens
        if accumulated + tokens > keep_recent_tokens and token_cut < count:
            break
        accumulated += tokens
        token_cut = index
    min_cut = count - MIN_TAIL_MESSAGES
    cut = min(token_cut, min_cut) if min_cut >= head_end else token_cut
    return _align_backward(messages, cut)


def is_overlay_message(message: Message) -> bool:
    return str(message.get("id", "")).startswith(COMPACTION_PREFIX)


def _text_of(message: Message, separator: str) -> str:
    return separator.join(
        _js_text(part.get("text"))
        for part in message.get("parts", ())
        if isinstance(part, dict) and part.get("type") == "text"
    )


def _js_text(value: Any) -> str:
    return js_string(value)


def _utf16_prefix(text: str, units: int) -> str:
    """The first `units` UTF-16 code units of `text` (JavaScript's String#slice)."""
    if len(text) <= units // 2:
        return text
    out = []
    used = 0
    for char in text:
        width = 2 if ord(char) > 0xFFFF else 1
        if used + width > units:
            if width == 2 and used < units:
                out.append(chr(0xD800 + ((ord(char) - 0x10000) >> 10)))  # JS keeps the pair's high half
            break
        out.append(char)
        used += width
    return "".join(out)


def _js_truthy(value: Any) -> bool:
    return not (value is None or value is False or value == 0 or value == "") or isinstance(value, dict | list)


def render_message(message: Message) -> str:
    """A message as the prompt shows it: its role, its text parts, then its tool calls."""
    text = _text_of(message, "\n")
    tools = []
    for part in message.get("parts", ()):
        if not _is_tool_part(part):
            continue
        name = part.get("toolName")
        lines = [f"[Tool: {'unknown' if name is None else _js_text(name)}]"]
        for label, key in (("Input", "input"), ("Output", "output")):
            value = part.get(key)
            if key in part and _js_truthy(value):
                lines.append(f"{label}: {_utf16_prefix(jsjson.stringify(value), TOOL_TEXT_LIMIT_UTF16)}")
        tools.append("\n".join(lines))
    tool_text = "\n".join(tools)
    return f"[{message.get('role')}]\n{text}" + (f"\n{tool_text}" if tool_text else "")


_MESSAGE_SEPARATOR = "\n\n---\n\n"

_SECTIONS = """## Topic
[What the conversation is about]

## Key Points
[Important information, decisions, and conclusions from the conversation]

## Current State
[Where things stand now — what has been done, what is in progress]

## Open Items
[Unresolved questions, pending tasks, or next steps discussed]

Target ~{budget} tokens. Be factual — only include information that was explicitly discussed in the \
conversation. Do NOT invent file paths, commands, or details that were not mentioned. Write only the summary body."""


def build_prompt(rendered: Sequence[str], previous_summary: str | None, budget: int) -> str:
    """The summarizer prompt, of the span's messages as `render_message` renders them: the
    first-compaction template, or the update template. Joined once: a prompt can be megabytes,
    and an intermediate text of the messages would be a second copy."""
    sections = _SECTIONS.format(budget=budget)
    if previous_summary:
        head = (
            "You are updating a conversation summary. A previous summary exists below. New conversation turns "
            "have occurred since then and need to be incorporated.\n\n"
            f"PREVIOUS SUMMARY:\n{previous_summary}\n\n"
            "NEW TURNS TO INCORPORATE:\n"
        )
        tail = (
            "\n\nUpdate the summary. PRESERVE existing information that is still relevant. ADD new information. "
            f"Remove information only if it is clearly obsolete.\n\n{sections}"
        )
    else:
        head = (
            "Create a concise summary of this conversation that preserves the important information for future "
            "context.\n\nCONVERSATION TO SUMMARIZE:\n"
        )
        tail = f"\n\nUse this structure:\n\n{sections}"
    pieces = [head]
    for index, text in enumerate(rendered):
        if index:
            pieces.append(_MESSAGE_SEPARATOR)
        pieces.append(text)
    pieces.append(tail)
    return "".join(pieces)


@dataclass(frozen=True, slots=True)
class SpanPlan:
    """The span a summary will replace, and what its prompt is made of: the non-overlay messages
    at history indexes `begin` to `end` (exclusive; `end - 1` is `to_message_id`'s), the overlays
    whose summaries it extends (`previous`, joined by `previous_summary` once their texts are
    read), the budget. `depends_on`: the ids whose update or delete makes the plan stale: the
    messages at `begin` to `end`, the span's ends, the messages beside its boundaries (whose
    tool parts placed them), and the ends of the records whose summaries it extends (deleted,
    their overlay no longer shows, nor would the new one that starts where the first did)."""

    from_message_id: str
    to_message_id: str
    begin: int
    end: int
    previous: tuple[MessageFacts, ...]
    budget_tokens: int
    depends_on: frozenset[str]


def previous_summary(summaries: Sequence[str]) -> str | None:
    """The previous summary a prompt extends: the texts of a plan's `previous` overlays."""
    return "\n\n".join(summaries) if summaries else None


def plan_span(
    history: Sequence[MessageFacts],
    compactions: Sequence[SpanRecord],
    *,
    keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS,
) -> SpanPlan | None:
    """Plans a compaction over a history read with overlays applied; None when there is
    nothing to compact."""
    if len(history) <= PROTECT_HEAD + MIN_TAIL_MESSAGES:
        return None
    start = _align_forward(history, PROTECT_HEAD)
    end = _tail_cut(history, start, keep_recent_tokens)
    first_kept = end
    if end <= start:
        return None
    middle = [m for m in history[start:end] if not m.overlay]
    if not middle:
        return None
    to_id = middle[-1].id
    from_id = middle[0].id

    # Iterative compaction extends an overlay visible on this branch (its synthetic message, or
    # both its ends raw in the history) rather than stacking a second one.
    ids = [m.id for m in history]
    present = set(ids)
    # One that starts after the span's last raw message (in the recent tail, or just before it)
    # is not extended: the span would begin after its end, a reversed span that hides nothing
    # (upstream plans it so, and with a policy set stored one such record, and asked the
    # summarizer, at every append).
    last_raw = max(index for index in range(start, end) if not history[index].overlay)
    existing = [
        c
        for c in compactions
        if (COMPACTION_PREFIX + c.id in present or (c.from_message_id in present and c.to_message_id in present))
        and (_span_start_index(ids, c) or 0) <= last_raw
    ]
    begin = start
    if existing:
        from_id = existing[0].from_message_id
        span_start = _span_start_index(ids, existing[0])
        if span_start is not None and span_start < start:
            # Everything the extended span covers must be summarized (deliberate difference).
            begin = span_start
            middle = [m for m in history[begin:end] if not m.overlay]

    # The span ends at its last raw message (`to_id`): an overlay after it, before the recent
    # tail, stays visible, so it is neither rendered nor a previous summary.
    end = max(index for index in range(begin, end) if not history[index].overlay) + 1
    # The summaries the new span hides go into the prompt, every one of them (upstream passes
    # only the first overlay's, and a later overlay's content was then in no summary at all).
    covered = [m for m in history[begin:end] if m.overlay]
    first = next((m for m in history[:end] if m.overlay), None)  # not one the span leaves visible
    summaries = covered or ([first] if first is not None else [])
    budget = max(100, math.floor(sum(m.tokens for m in middle) * 0.2))
    extended = {m.record_id for m in summaries if m.record_id is not None}
    record_ends = [end_id for c in compactions if c.id in extended for end_id in (c.from_message_id, c.to_message_id)]
    beside = [history[i].id for i in (start - 1, begin - 1, first_kept) if 0 <= i < len(history)]
    depends_on = frozenset([m.id for m in history[begin:end]] + [from_id, to_id] + beside + record_ends)
    return SpanPlan(from_id, to_id, begin, end, tuple(summaries), budget, depends_on)


def _span_start_index(ids: Sequence[str], record: SpanRecord) -> int | None:
    """Where a record's span begins in a history: its synthetic message, or its raw first row."""
    overlay = COMPACTION_PREFIX + record.id
    if overlay in ids:
        return ids.index(overlay)
    if record.from_message_id in ids:
        return ids.index(record.from_message_id)
    return None


def session_token_estimate(row_estimates: Sequence[tuple[str, int]], spans: Sequence[tuple[int, int, int]]) -> int:
    """Upstream's session estimate: stamped row estimates along the active path, minus rows
    under applied overlays, plus each overlay summary's string estimate (`estimate_string_tokens`
    of it, taken as its summary is read: the spans hold the estimates, not the summaries);
    ceil, floored at 0."""
    total = float(sum(tokens for _, tokens in row_estimates))
    for start, end, summary_tokens in spans:
        total -= sum(tokens for _, tokens in row_estimates[start : end + 1])
        total += summary_tokens
    return max(0, math.ceil(total))
