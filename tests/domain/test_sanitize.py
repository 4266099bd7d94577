"""Provider-metadata stripping, reasoning-part dropping and reserved-metadata removal."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sessions_server.domain.jsjson import parse, stringify
from sessions_server.domain.sanitize import (
    js_object_spread,
    js_truthy,
    sanitize_message,
    strip_reserved_metadata,
)


def msg(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": "m", "role": "assistant", "parts": list(parts), **extra}


def sanitized_json(text: str) -> str:
    return stringify(sanitize_message(parse(text)))


@pytest.mark.parametrize(
    ("value", "truthy"),
    [
        (None, False),
        (False, False),
        (0, False),
        (0.0, False),
        (-0.0, False),
        ("", False),
        (True, True),
        (1, True),
        (-1.5, True),
        ("0", True),
        (" ", True),
        ([], True),
        ({}, True),
    ],
)
def test_js_truthy(value: Any, truthy: bool) -> None:
    assert js_truthy(value) is truthy


def test_object_spread() -> None:
    assert js_object_spread("str") == {"0": "s", "1": "t", "2": "r"}
    assert js_object_spread("😀x") == {"0": "\ud83d", "1": "\ude00", "2": "x"}
    assert js_object_spread([1, 2]) == {"0": 1, "1": 2}
    assert js_object_spread(True) == {}
    assert js_object_spread(5) == {}
    assert js_object_spread(None) == {}
    original = {"a": 1}
    spread = js_object_spread(original)
    assert spread == original and spread is not original


def test_openai_item_id_removed_and_metadata_key_moves_last() -> None:
    part = {"type": "text", "providerMetadata": {"openai": {"itemId": "i", "other": 1}, "z": 1}, "text": "t"}
    out = sanitize_message(msg(part))
    assert stringify(out["parts"][0]) == ('{"type":"text","text":"t","providerMetadata":{"z":1,"openai":{"other":1}}}')


def test_metadata_removed_when_nothing_left() -> None:
    text = (
        '{"parts":[{"type":"text","providerMetadata":'
        '{"openai":{"itemId":"i","reasoningEncryptedContent":"e"}},"text":"t"}]}'
    )
    assert sanitized_json(text) == '{"parts":[{"type":"text","text":"t"}]}'
    text = '{"parts":[{"type":"text","providerMetadata":{"openai":{"itemId":"i"},"g":{}},"text":"t"}]}'
    assert sanitized_json(text) == '{"parts":[{"type":"text","text":"t","providerMetadata":{"g":{}}}]}'


def test_key_moves_even_when_nothing_removed() -> None:
    text = '{"parts":[{"callProviderMetadata":{"openai":{"x":1}},"type":"tool-a","input":1}]}'
    assert sanitized_json(text) == ('{"parts":[{"type":"tool-a","input":1,"callProviderMetadata":{"openai":{"x":1}}}]}')


@pytest.mark.parametrize(
    ("openai", "expected_metadata"),
    [
        ('"str"', '{"openai":{"0":"s","1":"t","2":"r"}}'),
        ("[1,2]", '{"openai":{"0":1,"1":2}}'),
        ("true", None),
        ("5", None),
        ("{}", None),
        ("[]", None),
        ('{"itemId":null}', None),
        ('{"10":1,"2":2,"itemId":"i"}', '{"openai":{"2":2,"10":1}}'),
    ],
)
def test_odd_openai_values(openai: str, expected_metadata: str | None) -> None:
    text = '{"parts":[{"type":"text","providerMetadata":{"openai":' + openai + '},"text":"t"}]}'
    expected = '{"parts":[{"type":"text","text":"t"'
    if expected_metadata is not None:
        expected += ',"providerMetadata":' + expected_metadata
    expected += "}]}"
    assert sanitized_json(text) == expected


@pytest.mark.parametrize("openai", ["null", "false", "0", '""'])
def test_falsy_openai_leaves_part_unchanged(openai: str) -> None:
    text = '{"parts":[{"type":"text","providerMetadata":{"openai":' + openai + '},"text":"t"}]}'
    assert sanitized_json(text) == text


@pytest.mark.parametrize("metadata", ["[1,2]", '"openai"', "null", "7", '{"OpenAI":{"itemId":"i"}}', "{}"])
def test_metadata_without_openai_key_untouched(metadata: str) -> None:
    text = '{"parts":[{"type":"text","providerMetadata":' + metadata + ',"text":"t"}]}'
    assert sanitized_json(text) == text


def test_both_metadata_keys_processed_in_order() -> None:
    text = '{"parts":[{"callProviderMetadata":{"openai":{"a":1}},"providerMetadata":{"openai":{"b":2}},"type":"x"}]}'
    assert sanitized_json(text) == (
        '{"parts":[{"type":"x","providerMetadata":{"openai":{"b":2}},"callProviderMetadata":{"openai":{"a":1}}}]}'
    )


@pytest.mark.parametrize(
    ("text", "dropped"),
    [
        ('""', True),
        ('" "', True),
        ('"\\t\\n"', True),
        ('"\\u00a0"', True),
        ('"\\ufeff"', True),
        ('"\\u2028\\u2029"', True),
        ('"\\u3000"', True),
        ('"\\u001c"', False),
        ('"\\u0085"', False),
        ('"\\u200b"', False),
        ('"\\u180e"', False),
        ('"x"', False),
        ("null", True),
        ("5", True),
        ("[]", True),
        ('{"a":1}', True),
    ],
)
def test_reasoning_drop(text: str, dropped: bool) -> None:
    raw = '{"parts":[{"type":"reasoning","text":' + text + '},{"type":"text","text":"after"}]}'
    parts = sanitize_message(parse(raw))["parts"]
    assert len(parts) == (1 if dropped else 2)
    assert parts[-1] == {"type": "text", "text": "after"}


@pytest.mark.parametrize(
    ("part", "kept"),
    [
        ({"type": "reasoning", "reasoning": "legacy only"}, False),
        ({"type": "reasoning", "text": "", "providerMetadata": {}}, False),
        ({"type": "reasoning", "text": "", "providerMetadata": {"anthropic": {}}}, True),
        ({"type": "reasoning", "text": "", "providerMetadata": {"openai": {"itemId": "i"}}}, False),
        ({"type": "reasoning", "text": "", "providerMetadata": {"openai": {"itemId": "i", "x": 1}}}, True),
        ({"type": "reasoning", "text": "", "providerMetadata": [1]}, True),
        ({"type": "reasoning", "text": "", "providerMetadata": []}, False),
        ({"type": "reasoning", "text": "", "providerMetadata": "str"}, False),
        ({"type": "reasoning", "text": "", "callProviderMetadata": {"x": 1}}, False),
        ({"type": "text", "text": ""}, True),
    ],
)
def test_reasoning_kept_only_with_provider_metadata(part: dict[str, Any], kept: bool) -> None:
    assert len(sanitize_message(msg(part))["parts"]) == (1 if kept else 0)


def test_sanitize_does_not_mutate_and_keeps_top_level_order() -> None:
    message = {
        "id": "m",
        "parts": [{"type": "text", "providerMetadata": {"openai": {"itemId": "i"}}, "text": "t"}],
        "role": "user",
        "metadata": {"a": 1},
    }
    before = copy.deepcopy(message)
    out = sanitize_message(message)
    assert message == before
    assert out is not message
    assert list(out) == ["id", "parts", "role", "metadata"]
    assert out["parts"] == [{"type": "text", "text": "t"}]


# ── reserved metadata ────────────────────────────────────────────────────────────────────────

RESERVED = ["reserved", "channel"]


def test_strip_reserved_removes_keys() -> None:
    message = {"id": "m", "metadata": {"reserved": 1, "other": 2}, "parts": []}
    out = strip_reserved_metadata(message, RESERVED)
    assert stringify(out) == '{"id":"m","metadata":{"other":2},"parts":[]}'
    assert message["metadata"] == {"reserved": 1, "other": 2}


def test_strip_reserved_drops_empty_metadata() -> None:
    message = {"id": "m", "metadata": {"reserved": 1, "channel": None}, "parts": []}
    assert stringify(strip_reserved_metadata(message, RESERVED)) == '{"id":"m","parts":[]}'


@pytest.mark.parametrize("metadata", [{"other": 1}, {}, None, [1], "reserved", {"Reserved": 1}])
def test_strip_reserved_returns_same_message_when_nothing_reserved(metadata: Any) -> None:
    message = {"id": "m", "metadata": metadata, "parts": []}
    assert strip_reserved_metadata(message, RESERVED) is message


def test_strip_reserved_without_keys_or_metadata() -> None:
    message = {"id": "m", "metadata": {"reserved": 1}, "parts": []}
    assert strip_reserved_metadata(message, []) is message
    bare = {"id": "m", "parts": []}
    assert strip_reserved_metadata(bare, RESERVED) is bare


def test_strip_reserved_uses_js_in_semantics() -> None:
    # `"constructor" in {}` is true in JS, so an empty metadata object counts as changed and goes.
    message = {"id": "m", "metadata": {}, "parts": []}
    assert strip_reserved_metadata(message, ["constructor"]) == {"id": "m", "parts": []}
    message = {"id": "m", "metadata": {"a": 1}, "parts": []}
    out = strip_reserved_metadata(message, ["toString"])
    assert out == message and out is not message
