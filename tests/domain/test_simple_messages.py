"""The common message's fast path (`is_simple_message`) prepares exactly what the full path does.

A message of the common shape skips the scan for plain data, the shape rules' walk, sanitizing,
stripping reserved metadata and the media pre-check; each case here is prepared both ways and
must give the same message, stamps, stored JSON, row and errors.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessions_server.domain import jsjson, messages
from sessions_server.domain.errors import SessionsError

RESERVED = ("origin", "toString", "x")


def full_path(text: str, *, from_client: bool, reserved: tuple[str, ...]) -> messages.PreparedMessage:
    """What every message went through before the fast path: scan, shape rules, each step."""
    if not text:
        return messages.parse_message(text)[0]  # type: ignore[return-value]  # raises
    try:
        value, plain = jsjson.parse_checked(text)
    except jsjson.JsonInputError:
        messages.parse_message(text)  # raises the same InvalidArgument
        raise AssertionError("unreachable") from None
    messages.check_message_shape(value, field="message_json")
    return messages.prepare_for_write(
        value, from_client=from_client, reserved_keys=reserved, source_text=text, plain=plain, simple=False
    )


def fast_path(text: str, *, from_client: bool, reserved: tuple[str, ...]) -> messages.PreparedMessage:
    value, plain, simple = messages.parse_client_message(text)
    return messages.prepare_for_write(
        value, from_client=from_client, reserved_keys=reserved, source_text=text, plain=plain, simple=simple
    )


def outcome(prepare: Any, text: str, **kwargs: Any) -> Any:
    try:
        prepared = prepare(text, **kwargs)
    except (SessionsError, TypeError) as exc:
        return ("error", type(exc).__name__, str(exc))
    row = prepared.row()
    extraction = prepared.extraction
    return (
        json.dumps(prepared.message, ensure_ascii=False),
        prepared.token_estimate,
        prepared.stored_json,
        prepared.json,
        json.dumps(extraction.message, ensure_ascii=False),
        extraction.payloads,
        extraction.references,
        extraction.uses,
        row,
    )


def assert_same(text: str) -> None:
    for from_client in (True, False):
        for reserved in ((), RESERVED):
            kwargs = {"from_client": from_client, "reserved": reserved}
            assert outcome(fast_path, text, **kwargs) == outcome(full_path, text, **kwargs), text


def m(**fields: Any) -> str:
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)


TEXT = {"type": "text", "text": "hello world"}

CASES = [
    m(id="a", role="user", parts=[TEXT]),
    m(id="a", role="user", parts=[]),
    m(id="a", role="user", parts=[TEXT, {"type": "text", "text": ""}, {"type": "text", "text": "   "}]),
    m(id="a", role="user", parts=[{"type": "text", "text": "x " * 500}]),
    m(id="a", role="user", parts=[{"type": "text", "text": "naïve 😀 \u2028 \u3000 text"}]),
    m(id="é", role="user", parts=[TEXT]),
    m(id="a", role="😀", parts=[TEXT]),
    m(id="a", role="user", parts=[{"type": "text", "text": "attachment:sha256:" + "0" * 64}]),
    m(id="a", role="user", parts=[{"type": "text", "text": '"data: \\u0041 \\'}]),
    m(id="a", role="user", createdAt="2024-01-01", metadata="origin", parts=[TEXT]),
    m(role="user", id="a", parts=[TEXT], zz="last"),
    m(parts=[TEXT], id="a", role="user"),
    m(id="a", role="user", parts=[{"text": "t", "type": "text", "state": "done", "providerMetadata": "x"}]),
    m(id="a", role="user", parts=[{"type": "tool-search", "input": "q", "output": "r", "toolCallId": "c"}]),
    m(id="a", role="user", parts=[{"type": "dynamic-tool", "input": "q", "result": "r"}]),
    m(id="a", role="user", parts=[{"type": "file", "mediaType": "image/png", "filename": "f"}]),
    m(id="a", role="user", parts=[{"type": "step-start"}, {"type": "other", "result": "r"}]),
    m(id="a", role="user", parts=[{"type": "reasoning", "text": ""}]),
    m(id="a", role="user", parts=[{"type": "reasoning", "text": "   "}, TEXT]),
    m(id="a", role="user", parts=[{"type": "reasoning", "text": "thought"}]),
    m(id="a", role="user", parts=[{"type": "reasoning", "text": "", "providerMetadata": "x"}]),
    m(id="a", role="user", parts=[{"type": "file", "url": "data:image/png;base64,AAAA", "mediaType": "image/png"}]),
    m(id="a", role="user", parts=[{"type": "file", "url": "https://example.com/a.png"}]),
    m(id="a", role="user", parts=[{"type": "file", "url": "attachment:sha256:" + "a" * 64}]),
    m(id="a", role="user", parts=[{"type": "data-x", "data": "AAAA", "mediaType": "image/png"}]),
    m(id="a", role="user", parts=[{"type": "text", "text": "t", "data": "x"}]),
    m(id="a", role="user", parts=[{"type": "text", "text": "t", "providerMetadata": {"openai": {"itemId": "i"}}}]),
    m(id="a", role="user", parts=[{"type": "text", "text": "t", "callProviderMetadata": {"openai": "x"}}]),
    m(id="a", role="user", metadata={"origin": "o", "x": 1, "keep": True}, parts=[TEXT]),
    m(id="a", role="user", metadata={"origin": "o"}, parts=[TEXT]),
    m(id="a", role="user", metadata={}, parts=[TEXT]),
    m(id="a", role="user", n=1, parts=[TEXT]),
    m(id="a", role="user", n=1.5, parts=[TEXT]),
    m(id="a", role="user", n=2**60, parts=[TEXT]),
    m(id="a", role="user", n=None, b=True, parts=[TEXT]),
    m(id="a", role="user", parts=[{"type": "text", "text": "t", "n": 1}]),
    m(id="a", role="user", parts=[{"type": "text", "text": None}]),
    m(id="a", role="user", parts=[{"type": "text", "text": ["a", None, "b"]}]),
    m(id="a", role="user", parts=[{"type": "text", "text": "t", "nested": {"url": "data:x"}}]),
    '{"0":"x","id":"a","role":"user","parts":[]}',
    '{"id":"a","role":"user","1":"x","0":"y","parts":[]}',
    '{"id":"a","role":"user","01":"x","parts":[]}',
    '{"id":"a","role":"user","":"x","parts":[]}',
    '{"id":"a","role":"user","parts":[{"type":"text","text":"t","0":"z","":"e"}]}',
    '{"id":"a","role":"user","parts":[{"1":"z","type":"text","text":"t","0":"y"}]}',
    '{"id":"a","id":"b","role":"user","parts":[]}',
    '{"id":"a","role":"user","parts":[{"type":"text","text":"a","text":"b"}]}',
    ' {\n "id" : "a" , "role":"user","parts":[ {"type":"text","text":"spaced"} ] } ',
    '{"id":"a","role":"user","parts":[{"type":"text","text":"\\ud800 lone"}]}',
    '{"id":"\\udc00","role":"user","parts":[]}',
    '{"id":"a","role":"user","parts":[{"type":"text","text":"\\ud83d\\ude00 pair"}]}',
    '{"id":"a","role":"user","parts":[{"type":"text","text":"\\u0000\\n\\t\\"\\\\/"}]}',
    # Not messages, not JSON:
    "",
    "[]",
    '"text"',
    "null",
    "{",
    '{"id":"a","role":"user","parts":[TEXT]}',
    m(id=1, role="user", parts=[]),
    m(id="a", role=None, parts=[]),
    m(id="a", parts=[]),
    m(id="a", role="user"),
    m(id="a", role="user", parts="x"),
    m(id="a", role="user", parts=["x"]),
    m(id="a", role="user", parts=[{"text": "no type"}]),
    m(id="a", role="user", parts=[{"type": 3}]),
    m(id="a", role="user", parts=[{"type": "file", "url": "data:x;base64,AA", "mediaType": 1}]),
    "[" * 70 + "]" * 70,
]


@pytest.mark.parametrize("text", CASES)
def test_fast_path_prepares_as_the_full_path(text: str) -> None:
    assert_same(text)


def test_the_common_shape_takes_the_fast_path() -> None:
    text = m(id="a", role="user", parts=[TEXT, {"type": "tool-x", "input": "i", "state": "done"}])
    assert messages.parse_client_message(text)[1:] == (True, True)
    for slow in (
        m(id="a", role="user", metadata={}, parts=[TEXT]),
        m(id="a", role="user", parts=[{"type": "reasoning", "text": "t"}]),
        m(id="a", role="user", parts=[{"type": "file", "url": "u"}]),
        '{"id":"a","role":"user","0":"x","parts":[]}',
    ):
        assert messages.parse_client_message(slow)[2] is False, slow


_KEYS = ("type", "text", "state", "input", "output", "result", "reasoning", "url", "data", "mediaType", "metadata")
_keys = st.sampled_from((*_KEYS, "providerMetadata", "0", "1", "", "é", "toString", "openai", "itemId"))
_scalars = st.one_of(
    st.text(max_size=12), st.sampled_from(["", " ", "text", "reasoning", "file", "tool-x", "data:image/png;base64,AA"])
)
_values = st.recursive(
    st.one_of(_scalars, st.none(), st.booleans(), st.integers(-3, 3)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=6,
)
_parts = st.lists(
    st.one_of(
        st.dictionaries(_keys, _scalars, max_size=4).map(lambda d: {"type": "text", **d}),
        st.dictionaries(_keys, _values, max_size=4),
    ),
    max_size=4,
)
_top = st.dictionaries(st.sampled_from(["createdAt", "metadata", "0", "", "z", "id", "role"]), _values, max_size=3)


@settings(max_examples=400, deadline=None)
@given(top=_top, parts=_parts, ident=st.text(min_size=1, max_size=4), role=st.sampled_from(["user", "assistant"]))
def test_fast_path_matches_on_generated_messages(top: dict[str, Any], parts: list[Any], ident: str, role: str) -> None:
    assert_same(json.dumps({"id": ident, "role": role, **top, "parts": parts}, ensure_ascii=False))
    assert_same(json.dumps({**top, "id": ident, "parts": parts, "role": role}))
