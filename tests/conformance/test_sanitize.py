"""sanitizeMessage and the reserved-metadata strip (reference notes §2.1, §2.2, §16).

Both sides run with reserved metadata keys ("reserved", "channel")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.harness.messages import msg, parts_msg
from tests.conformance.harness.pair import Pair

PROVIDER_CASES: list[tuple[str, dict[str, Any]]] = [
    ("strip-both", {"openai": {"itemId": "i1", "reasoningEncryptedContent": "enc", "other": 1}, "z": 1}),
    ("only-openai-emptied", {"openai": {"itemId": "i1"}}),
    ("openai-emptied-others-stay", {"openai": {"itemId": "i1"}, "anthropic": {"x": 1}}),
    ("nothing-removed-still-moves", {"openai": {"keep": True}, "a": 1}),
    ("openai-null", {"openai": None, "a": 1}),
    ("openai-string", {"openai": "str"}),
    ("openai-array", {"openai": [1, 2]}),
    ("openai-true", {"openai": True}),
    ("openai-empty-object", {"openai": {}}),
    ("openai-zero", {"openai": 0}),
    ("openai-empty-string", {"openai": ""}),
    ("no-openai", {"google": {"itemId": "x"}}),
    ("empty-metadata", {}),
]


@pytest.mark.parametrize(("name", "meta"), PROVIDER_CASES, ids=[c[0] for c in PROVIDER_CASES])
def test_provider_metadata(pair: Pair, name: str, meta: dict[str, Any]) -> None:
    parts = [
        {"type": "text", "text": "a", "providerMetadata": meta, "after": 1},
        {
            "type": "tool-x",
            "toolCallId": "t1",
            "state": "output-available",
            "input": {"q": 1},
            "output": "ok",
            "callProviderMetadata": meta,
        },
        {"type": "step-start", "providerMetadata": meta, "callProviderMetadata": meta},
    ]
    pair.append(parts_msg("m1", parts))
    pair.update(parts_msg("m1", [*parts, {"type": "text", "text": "b", "providerMetadata": meta}]))
    pair.upsert(parts_msg("m2", parts))
    pair.import_(parts_msg("m3", parts), parent="m2", created_at=1_600_000_000_123)


def test_provider_metadata_value_not_object(pair: Pair) -> None:
    parts = [
        {"type": "text", "text": "a", "providerMetadata": None},
        {"type": "text", "text": "b", "providerMetadata": "text"},
        {"type": "text", "text": "c", "providerMetadata": [{"openai": {"itemId": 1}}]},
        {"type": "text", "text": "d", "providerMetadata": 7},
        {"type": "text", "text": "e", "providerMetadata": {"openai": {"itemId": "x"}}, "callProviderMetadata": None},
    ]
    pair.append(parts_msg("m1", parts))


REASONING_TEXTS = [
    ("empty", ""),
    ("spaces", "   "),
    ("nbsp-bom-ideographic", "\u00a0\ufeff\u3000"),
    ("line-separators", "\u2028\u2029\n\t\r\v\f"),
    ("info-separators-not-space", "\x1c\x1d\x1e\x1f"),
    ("nel-not-space", "\x85"),
    ("zwsp-not-space", "\u200b"),
    ("mongolian-vowel-sep-not-space", "\u180e"),
    ("ogham-space", "\u1680"),
    ("en-quad-to-hair", "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f"),
    ("real-text", " thinking "),
]


@pytest.mark.parametrize(("name", "text"), REASONING_TEXTS, ids=[c[0] for c in REASONING_TEXTS])
def test_reasoning_whitespace(pair: Pair, name: str, text: str) -> None:
    parts: list[dict[str, Any]] = [
        {"type": "reasoning", "text": text},
        {"type": "reasoning", "text": text, "providerMetadata": {"openai": {"itemId": "x"}}},
        {"type": "reasoning", "text": text, "providerMetadata": {"openai": {"itemId": "x", "k": 1}}},
        {"type": "reasoning", "text": text, "providerMetadata": {"anthropic": {"signature": "s"}}},
        {"type": "text", "text": text},
    ]
    pair.append(parts_msg("m1", parts), check=False)
    pair.append(parts_msg("m2", [{"type": "reasoning", "text": text}]))


def test_reasoning_non_string_text(pair: Pair) -> None:
    parts: list[dict[str, Any]] = [
        {"type": "reasoning", "reasoning": "legacy field only"},
        {"type": "reasoning", "text": 5},
        {"type": "reasoning", "text": None},
        {"type": "reasoning", "text": ["a"]},
        {"type": "reasoning", "text": {"t": "x"}},
        {"type": "reasoning"},
        {"type": "reasoning", "text": "kept", "reasoning": "x"},
        {"type": "text", "text": "visible"},
    ]
    pair.append(parts_msg("m1", parts))


def test_import_does_not_sanitize(pair: Pair) -> None:
    parts = [
        {"type": "reasoning", "text": "  "},
        {"type": "text", "text": "a", "providerMetadata": {"openai": {"itemId": "i"}, "z": 1}},
    ]
    pair.import_(
        parts_msg("m1", parts, metadata={"reserved": 1, "channel": 2}), parent=None, created_at=1_600_000_000_000
    )
    pair.append(msg("m2"))


RESERVED_CASES: list[tuple[str, Any]] = [
    ("one-reserved", {"reserved": 1, "keep": 2}),
    ("all-reserved", {"reserved": 1, "channel": "c"}),
    ("none-reserved", {"keep": 1}),
    ("empty", {}),
    ("array", ["reserved"]),
    ("null", None),
    ("string", "reserved"),
    ("nested-not-stripped", {"inner": {"reserved": 1}, "channel": None}),
]


@pytest.mark.parametrize(("name", "metadata"), RESERVED_CASES, ids=[c[0] for c in RESERVED_CASES])
def test_reserved_metadata(pair: Pair, name: str, metadata: Any) -> None:
    pair.append(msg("c1", metadata=metadata), source="client")
    pair.append(msg("s1", metadata=metadata), source="server")
    pair.append(msg("d1", metadata=metadata))
    pair.update(msg("s1", "updated by client", metadata=metadata), source="client")
    pair.update(msg("c1", "updated by server", metadata=metadata), source="server")
    pair.upsert(msg("u1", metadata=metadata), source="client")
    pair.upsert(msg("u1", "again", metadata=metadata), source="client")
    pair.upsert(msg("s1", "upsert existing", metadata=metadata), source="client")


def test_reserved_strip_makes_duplicate_and_noop(pair: Pair) -> None:
    pair.append(msg("a", metadata={"keep": 1}))
    pair.update(msg("a", metadata={"keep": 1, "reserved": "x"}), source="client")  # strips to identical: no-op
    pair.update(msg("a", metadata={"reserved": "x"}), source="client")  # metadata removed entirely
    pair.append(msg("a", metadata={"channel": 1}), source="client")  # duplicate: stored row returned
