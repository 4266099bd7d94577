"""Malformed input that upstream also refuses: both sides must fail and store nothing (the error
texts differ by nature; only "both failed" is compared). Deliberate differences are in
test_differences.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.harness.messages import msg
from tests.conformance.harness.pair import Pair

NOT_OBJECTS = ["null", "[]", '"text"', "1", "true"]
BAD_PARTS: list[tuple[str, Any]] = [
    ("part-without-type", [{"text": "a"}]),
    ("part-type-number", [{"type": 1, "text": "a"}]),
    ("part-null", [None]),
    ("part-string", ["text"]),
]


@pytest.mark.parametrize("text", NOT_OBJECTS)
def test_message_not_an_object(pair: Pair, text: str) -> None:
    pair.append(msg("a"))
    pair.append(text)
    pair.update(text)
    pair.upsert(text)


@pytest.mark.parametrize(("name", "parts"), BAD_PARTS, ids=[c[0] for c in BAD_PARTS])
def test_bad_parts(pair: Pair, name: str, parts: Any) -> None:
    """Upstream's token estimator throws on a part without a string `type`."""
    pair.append(msg("a"))
    pair.append({"id": "b", "role": "user", "parts": parts})
    pair.update({"id": "a", "role": "user", "parts": parts})
    pair.upsert({"id": "c", "role": "user", "parts": parts})
