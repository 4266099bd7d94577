"""Token estimates: string heuristic, per-part rules with JS `??` semantics, row media charge."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions_server.domain.jsjson import js_word_count, utf16_length
from sessions_server.domain.tokens import (
    estimate_attachment_tokens,
    estimate_message_tokens,
    estimate_row_tokens,
    estimate_string_tokens,
    estimate_value_tokens,
    estimated_data_url_bytes,
)


def msg(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"id": "m", "role": "user", "parts": list(parts)}


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("hello", 2),  # max(5/4, 1 * 1.3) = 1.3 -> 2
        ("abcd", 2),  # max(1, 1.3)
        ("x" * 400, 100),
        ("x" * 401, 101),
        ("a b c d e f g h i j", 13),  # 10 words * 1.3 == 13.0
        ("a " * 3, 4),  # 3 words -> 3.9 -> 4
        ("😀" * 10, 5),  # 20 UTF-16 units / 4
        ("a\x1cb\x1cc", 2),  # one word: max(5/4, 1.3)
        ("a\xa0b\xa0c", 4),  # three words: 3.9
        ("   ", 1),  # no words, 3/4 -> 1
    ],
)
def test_estimate_string_tokens(text: str, tokens: int) -> None:
    assert estimate_string_tokens(text) == tokens


@given(
    st.text(alphabet=st.sampled_from("ab \t\n\x0b\x0c\r"), max_size=200)
    | st.text(alphabet=st.sampled_from("abcdefgh \t\n\xa0\u3000é😀"), max_size=200)
    | st.lists(st.sampled_from(["word", "a", " ", "\t", "\n", "  "]), max_size=80).map("".join)
)
def test_string_tokens_follow_the_formula(text: str) -> None:
    # The ASCII shortcut (at most one more word than whitespace characters) must never change it.
    formula = math.ceil(max(utf16_length(text) / 4, js_word_count(text) * 1.3)) if text else 0
    assert estimate_string_tokens(text) == formula


@pytest.mark.parametrize(
    "text",
    [
        "a\tb\tc\td\te\tf",  # words separated only by tabs: spaces alone would bound them at 1
        "a\nb\rc\x0bd\x0ce f",
        "abcdefghijklm nopqrstuvwxyz",  # 2 words bound, 2.6 <= 27/4: the shortcut answers
        "abcde",  # 1.3 > 5/4: the words decide
        "x" * 5_000_000 + " y",  # long, ASCII
    ],
)
def test_string_tokens_shortcut_cases(text: str) -> None:
    assert estimate_string_tokens(text) == math.ceil(max(len(text) / 4, js_word_count(text) * 1.3))


def test_word_estimate_uses_double_arithmetic() -> None:
    # 3 * 1.3 == 3.9000000000000004 in IEEE doubles; ceil is still 4.
    assert estimate_string_tokens("a b c") == math.ceil(3 * 1.3) == 4
    words = " ".join(["w"] * 10)
    assert estimate_string_tokens(words) == math.ceil(max(len(words) / 4, 10 * 1.3))


def test_reference_examples() -> None:
    assert estimate_row_tokens(msg({"type": "text", "text": "hello"})) == 6
    assert estimate_row_tokens(msg()) == 4
    jpeg = {"type": "file", "mediaType": "image/jpeg", "url": "data:image/jpeg;base64,/9j/4AAQ"}
    assert estimate_row_tokens(msg(jpeg)) == 1604


def test_value_tokens() -> None:
    assert estimate_value_tokens(None) == 0
    assert estimate_value_tokens("hello") == 2
    assert estimate_value_tokens({"a": 1}) == estimate_string_tokens('{"a":1}')
    assert estimate_value_tokens(True) == estimate_string_tokens("true")
    assert estimate_value_tokens(0) == estimate_string_tokens("0") == 2
    assert estimate_value_tokens(1.0) == estimate_string_tokens("1")
    assert estimate_value_tokens([]) == estimate_string_tokens("[]")


def test_text_and_reasoning_use_nullish_coalescing() -> None:
    words = "one two three four five"
    assert estimate_message_tokens([msg({"type": "text", "text": None, "reasoning": words})]) == 4 + 7
    assert estimate_message_tokens([msg({"type": "text", "reasoning": words})]) == 4 + 7
    # "" is not nullish: reasoning is ignored.
    assert estimate_message_tokens([msg({"type": "text", "text": "", "reasoning": words})]) == 4
    assert estimate_message_tokens([msg({"type": "reasoning", "text": "hello", "reasoning": words})]) == 6
    assert estimate_message_tokens([msg({"type": "text"})]) == 4


def test_tool_parts() -> None:
    input_value = {"city": "Paris"}
    part: dict[str, Any] = {
        "type": "tool-weather",
        "input": input_value,
        "output": "sunny",
        "result": "ignored words here",
    }
    expected = 4 + estimate_string_tokens('{"city":"Paris"}') + estimate_string_tokens("sunny")
    assert estimate_message_tokens([msg(part)]) == expected
    part = {"type": "dynamic-tool", "input": None, "output": None, "result": [1, 2]}
    assert estimate_message_tokens([msg(part)]) == 4 + estimate_string_tokens("[1,2]")
    part = {"type": "tool-x", "output": False, "result": "ignored"}
    assert estimate_message_tokens([msg(part)]) == 4 + estimate_string_tokens("false")
    # "tools-x" is not a tool part: its text counts instead.
    assert estimate_message_tokens([msg({"type": "tools-x", "input": "zzzz zzzz", "text": "hi"})]) == 6


def test_other_parts_text_then_result() -> None:
    # A present-but-null text wins over result (JS `part.text !== undefined`) and costs 0.
    assert estimate_message_tokens([msg({"type": "data-x", "text": None, "result": "a b c d"})]) == 4
    assert estimate_message_tokens([msg({"type": "data-x", "result": "a b c d"})]) == 4 + 6
    assert estimate_message_tokens([msg({"type": "data-x", "text": {"k": 1}})]) == 4 + 2
    assert estimate_message_tokens([msg({"type": "step-start"})]) == 4


def test_multiple_messages() -> None:
    assert estimate_message_tokens([msg(), msg({"type": "text", "text": "hello"})]) == 10
    assert estimate_message_tokens([]) == 0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("data:text/plain;base64,aGVsbG8=", 6),  # floor(8 * 3 / 4)
        ("data:text/plain;base64,aGVsbG8", 5),  # floor(7 * 3 / 4) = 5
        ("data:text/plain,hello", 5),
        ("data:,", 0),
        ("data:text/plain;base64", 0),  # no comma
        ("https://example.com/a,b", 0),
        ("data:text/plain,😀", 2),  # UTF-16 units
        ("data:text/plain;base64x,abcd", 4),
    ],
)
def test_estimated_data_url_bytes(url: str, expected: int) -> None:
    assert estimated_data_url_bytes(url) == expected


def test_attachment_tokens() -> None:
    assert estimate_attachment_tokens("image/png", 10**9) == 1600
    assert estimate_attachment_tokens("image/", 0) == 1600
    assert estimate_attachment_tokens("application/pdf", 0) == 0
    assert estimate_attachment_tokens("application/pdf", 1) == 1
    assert estimate_attachment_tokens("text/plain", 400) == 100
    assert estimate_attachment_tokens("text/plain", 401) == 101
    assert estimate_attachment_tokens("text/plain", 80_000) == 20_000
    assert estimate_attachment_tokens("text/plain", 80_001) == 20_000
    assert estimate_attachment_tokens("IMAGE/png", 8) == 2


def test_row_tokens_file_parts() -> None:
    # No mediaType: charged as octet-stream even for an image URL header.
    no_type = {"type": "file", "url": "data:image/png;base64," + "A" * 400}
    assert estimate_row_tokens(msg(no_type)) == 4 + 75
    null_type = {"type": "file", "mediaType": None, "url": "data:image/png,abc"}
    assert estimate_row_tokens(msg(null_type)) == 4 + 1
    # Declared image type on a non-base64 URL: flat image charge.
    assert estimate_row_tokens(msg({"type": "file", "mediaType": "image/png", "url": "data:x,y"})) == 1604
    text_file = {"type": "file", "mediaType": "text/plain", "url": "data:text/plain," + "a" * 100_000}
    assert estimate_row_tokens(msg(text_file)) == 4 + 20_000
    remote = {"type": "file", "mediaType": "image/png", "url": "https://x/y.png"}
    assert estimate_row_tokens(msg(remote)) == 4
    upper = {"type": "file", "mediaType": "image/png", "url": "DATA:image/png,x"}
    assert estimate_row_tokens(msg(upper)) == 4
    # File parts still charge their text through the message estimate.
    with_text = {"type": "file", "mediaType": "text/plain", "url": "data:,abcd", "text": "hello"}
    assert estimate_row_tokens(msg(with_text)) == 4 + 2 + 1
    # Nested media only counts through its JSON text.
    nested = {"type": "tool-x", "output": {"type": "file", "mediaType": "image/png", "url": "data:,a"}}
    assert estimate_row_tokens(msg(nested)) == estimate_message_tokens([msg(nested)])
    bad = {"type": "file", "mediaType": 5, "url": "data:,a"}
    with pytest.raises(TypeError):
        estimate_row_tokens(msg(bad))
