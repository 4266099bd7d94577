"""Replay golden vectors recorded from upstream `agents@0.32.0` (see record_vectors.py).

For every recorded append: parse the raw JSON text, sanitize, strip reserved metadata for client
writes, then the stored JSON, its SHA-256, its slices and the token estimate must all equal what
upstream stored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import jsjson
from sessions_server.domain.chunking import split_content, utf8_length
from sessions_server.domain.sanitize import sanitize_message, strip_reserved_metadata
from sessions_server.domain.tokens import estimate_row_tokens

VECTORS_PATH = Path(__file__).resolve().parent / "vectors" / "upstream_messages.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
RESERVED_KEYS = ["reserved", "channel"]


def _input_text(vector: dict[str, Any]) -> str:
    if "input" in vector:
        text: str = vector["input"]
        return text
    prefix, unit, count, suffix = vector["input_repeat"]
    return str(prefix + unit * count + suffix)


def _vector_id(vector: dict[str, Any]) -> str:
    text = vector.get("input") or vector["input_repeat"][0]
    return str(text[7:11])


def test_vector_file_is_substantial() -> None:
    assert len(VECTORS) >= 150
    assert any(v["content_chunks"] >= 3 for v in VECTORS)


@pytest.mark.parametrize("vector", VECTORS, ids=_vector_id)
def test_matches_upstream(vector: dict[str, Any]) -> None:
    message = jsjson.parse(_input_text(vector))
    prepared = sanitize_message(message)
    if vector["source"] == "client":
        prepared = strip_reserved_metadata(prepared, RESERVED_KEYS)
    stored = jsjson.stringify(prepared)

    if "content" in vector:
        assert stored == vector["content"]
    assert len(stored) == vector["content_length"]
    assert hashlib.sha256(stored.encode("utf-8")).hexdigest() == vector["content_hash"]

    slices = split_content(stored)
    assert len(slices) - 1 == vector["content_chunks"]
    assert [utf8_length(s) for s in slices] == vector["slice_utf8_bytes"]

    assert estimate_row_tokens(prepared) == vector["token_estimate"]


NUMBERS_PATH = Path(__file__).resolve().parent / "vectors" / "js_numbers.json"
NUMBER_PAIRS: list[list[str]] = json.loads(NUMBERS_PATH.read_text(encoding="utf-8"))


def test_number_literals_match_node() -> None:
    """1,500 random number literals: stringify(parse(s)) equals node's JSON round trip."""
    assert len(NUMBER_PAIRS) >= 1000
    mismatches = [
        (literal, expected, jsjson.stringify(jsjson.parse(literal)))
        for literal, expected in NUMBER_PAIRS
        if jsjson.stringify(jsjson.parse(literal)) != expected
    ]
    assert mismatches == []
