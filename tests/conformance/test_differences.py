"""Deliberate differences from upstream (DESIGN.md §9), asserted AS differences: each test runs the
operation on both sides and checks that upstream still does its thing and we do ours, so neither
can drift silently. Feature-specific ones (attachments, search, compaction, feed) join their
feature modules' difference tests as those land."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from tests.conformance.harness.messages import msg
from tests.conformance.harness.oracle import OracleError
from tests.conformance.harness.pair import Pair


def _ours_rejects(call: Any) -> SessionsError:
    with pytest.raises(SessionsError) as info:
        call()
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return info.value


NO_ROLE = {"id": "x", "parts": [{"type": "text", "text": "no role"}]}
BAD_SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("no-role", NO_ROLE),
    ("null-role", {"id": "x", "role": None, "parts": []}),
    ("numeric-role", {"id": "x", "role": 1, "parts": []}),
    ("numeric-id", {"id": 7, "role": "user", "parts": []}),
    ("no-id", {"role": "user", "parts": []}),
    ("parts-object", {"id": "x", "role": "user", "parts": {"0": {"type": "text", "text": "a"}}}),
    ("no-parts", {"id": "x", "role": "user"}),
]


@pytest.mark.parametrize(("name", "message"), BAD_SHAPES, ids=[c[0] for c in BAD_SHAPES])
def test_append_bad_shape_upstream_throws_we_reject(pair: Pair, name: str, message: dict[str, Any]) -> None:
    """Upstream throws (TypeError / SqlError NOT NULL; "no-parts" is stored by upstream); we answer
    INVALID_ARGUMENT. Nothing is stored on our side."""
    pair.append(msg("a"))
    try:
        up = pair.up("appendMessage", {"message": message})
        upstream = f"returned {up}"
    except OracleError as exc:
        upstream = f"threw {exc.name}: {exc}"
    _ours_rejects(lambda: pair.ours().append_message(message))
    if name == "no-parts":
        # Upstream's estimator tolerates a missing parts array on append.
        assert upstream.startswith("returned") or upstream.startswith("threw"), upstream
    else:
        assert upstream.startswith("threw"), f"upstream no longer throws for {name}: {upstream}"
    assert [r["id"] for r in pair.our_rows_now().messages] == ["a"]


def test_duplicate_append_without_role(pair: Pair) -> None:
    """Upstream returns the stored row (inserted:false) for a duplicate id even without a role; we reject."""
    pair.append(msg("x"))
    up = pair.up("appendMessage", {"message": NO_ROLE})
    assert up["inserted"] is False and up["message"]["role"] == msg("x")["role"]
    _ours_rejects(lambda: pair.ours().append_message(NO_ROLE))
    pair.check()


def test_update_without_role(pair: Pair) -> None:
    """Upstream: absent id → null, present id → throws (NOT NULL). We reject both."""
    assert pair.up("updateMessage", {"message": {**NO_ROLE, "id": "absent"}}) is None
    _ours_rejects(lambda: pair.ours().update_message({**NO_ROLE, "id": "absent"}))
    pair.append(msg("x"))
    with pytest.raises(OracleError):
        pair.up("updateMessage", {"message": NO_ROLE})
    _ours_rejects(lambda: pair.ours().update_message(NO_ROLE))
    pair.check()


def test_import_without_role(pair: Pair) -> None:
    """Upstream's importMessage silently stores nothing (INSERT OR IGNORE swallows NOT NULL); we reject."""
    pair.append(msg("a"))
    assert pair.up("importMessage", {"message": NO_ROLE, "options": {"parentId": "a", "createdAt": 1}}) is None
    _ours_rejects(lambda: pair.ours().import_message(NO_ROLE, parent_id="a", created_at=1))
    pair.check()  # neither side stored it


@pytest.mark.parametrize(("name", "message"), BAD_SHAPES[3:], ids=[c[0] for c in BAD_SHAPES[3:]])
def test_import_bad_shape(pair: Pair, name: str, message: dict[str, Any]) -> None:
    """Import validates like every other write path here; upstream's outcome is recorded."""
    try:
        pair.up("importMessage", {"message": message, "options": {"parentId": None, "createdAt": 1}})
    except OracleError:
        pass
    _ours_rejects(lambda: pair.ours().import_message(message, parent_id=None, created_at=1))
    assert pair.our_rows_now().messages == []


def test_resolved_parent_is_reported(pair: Pair) -> None:
    """Upstream's append result is {inserted, message}; ours also names the parent used, so an
    unknown parent visibly made a root. The value equals upstream's stored parent_id."""
    pair.append(msg("a"))
    up = pair.up("appendMessage", {"message": msg("b"), "options": {"parentId": "unknown"}})
    assert set(up) == {"inserted", "message"}
    ours = pair.ours().append_message(msg("b"), parent_id="unknown")
    assert ours.parent_id is None
    up_c = pair.up("appendMessage", {"message": msg("c")})
    ours_c = pair.ours().append_message(msg("c"))
    assert set(up_c) == {"inserted", "message"} and ours_c.parent_id == "b"
    pair.check()
