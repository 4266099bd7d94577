"""UpdateMessage and UpsertMessage (reference notes §5): absent ids, digest-based no-ops, what a
changed update rewrites and what it keeps, and upsert's append-or-update without re-parenting."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.service.support import (
    ids,
    js_json,
    message_row,
    message_rows,
    object_file,
    sha256_hex,
    text_message,
)


@contextlib.contextmanager
def commit_watch(data_dir: Path, object_key: str) -> Iterator[Any]:
    """Yields a function telling whether anyone committed to the file since the watch began
    (SQLite's PRAGMA data_version changes when another connection commits a change)."""
    conn = sqlite3.connect(f"file:{object_file(data_dir, object_key)}?mode=ro", uri=True, isolation_level=None)
    try:
        start = conn.execute("PRAGMA data_version").fetchone()[0]
        yield lambda: conn.execute("PRAGMA data_version").fetchone()[0] != start
    finally:
        conn.close()


def test_update_of_absent_id_returns_none_and_writes_nothing(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    before = message_rows(data_dir, object_key)
    with commit_watch(data_dir, object_key) as committed:
        assert session.update_message(text_message("missing", "x")) is None
        assert not committed()
    assert message_rows(data_dir, object_key) == before
    assert session.get_message("missing") is None


def test_unchanged_update_writes_nothing(session: Any, data_dir: Path, object_key: str) -> None:
    message = text_message("a", "same")
    session.append_message(message)
    session.append_message(text_message("b"))
    before = message_rows(data_dir, object_key)

    with commit_watch(data_dir, object_key) as committed:
        result = session.update_message(message)
        assert not committed(), "an unchanged update committed a write"

    assert result == message
    assert message_rows(data_dir, object_key) == before


def test_unchanged_after_sanitize_is_a_no_op(session: Any, data_dir: Path, object_key: str) -> None:
    """The digest compares the prepared form: re-sending provider ids that sanitize strips is
    unchanged."""
    part = {"type": "text", "text": "t", "providerMetadata": {"openai": {"itemId": "i1"}}}
    session.append_message({"id": "a", "role": "assistant", "parts": [part]})
    before = message_rows(data_dir, object_key)
    part2 = {"type": "text", "text": "t", "providerMetadata": {"openai": {"itemId": "i2"}}}
    with commit_watch(data_dir, object_key) as committed:
        session.update_message({"id": "a", "role": "assistant", "parts": [part2]})
        assert not committed()
    assert message_rows(data_dir, object_key) == before


def test_changed_update_rewrites_content_and_keeps_position(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a", "one"))
    session.append_message(text_message("b", "two"))
    session.append_message(text_message("c", "three"))
    before = message_row(data_dir, object_key, "b")
    assert before is not None
    others_before = [r for r in message_rows(data_dir, object_key) if r["id"] != "b"]

    new = text_message("b", "hello", role="assistant", metadata={"edited": True})
    with commit_watch(data_dir, object_key) as committed:
        result = session.update_message(new)
        assert committed()  # the watch does see a real write

    after = message_row(data_dir, object_key, "b")
    assert after is not None
    assert result == new
    assert after["content"] == js_json(new)
    assert after["content_hash"] == sha256_hex(js_json(new)) != before["content_hash"]
    assert after["token_estimate"] == 6
    assert after["role"] == "assistant"
    for column in ("seq", "parent_id", "created_at", "session_id", "type", "content_chunks"):
        assert after[column] == before[column], column
    assert session.get_message("b") == new
    assert session.get_latest_leaf()["id"] == "c"  # an update does not move the leaf
    assert ids(session.get_history()) == ["a", "b", "c"]
    # other rows untouched
    assert [r for r in message_rows(data_dir, object_key) if r["id"] != "b"] == others_before


def test_change_only_in_key_order_is_a_change(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message('{"id":"a","role":"user","parts":[],"x":1,"y":2}')
    session.update_message('{"id":"a","role":"user","parts":[],"y":2,"x":1}')
    assert message_row(data_dir, object_key, "a")["content"] == (  # type: ignore[index]
        '{"id":"a","role":"user","parts":[],"y":2,"x":1}'
    )


def test_update_sanitizes(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    session.update_message(
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "text": ""},
                {"type": "text", "text": "x", "providerMetadata": {"openai": {"itemId": "i", "k": 1}}, "z": 0},
            ],
        }
    )
    assert message_row(data_dir, object_key, "a")["content"] == (  # type: ignore[index]
        '{"id":"a","role":"assistant","parts":[{"type":"text","text":"x","z":0,"providerMetadata":{"openai":{"k":1}}}]}'
    )


def test_update_of_overlay_id_returns_none(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    before = message_rows(data_dir, object_key)
    assert session.update_message(text_message("compaction_x", "s", role="assistant")) is None
    assert message_rows(data_dir, object_key) == before


# ── upsert ──────────────────────────────────────────────────────────────────


def test_upsert_of_new_id_appends_with_auto_parent(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    result = session.upsert_message(text_message("b"))
    assert (result.inserted, result.changed) == (True, False)
    assert result.message == text_message("b")
    row = message_row(data_dir, object_key, "b")
    assert row is not None
    assert (row["parent_id"], row["seq"]) == ("a", 2)


def test_upsert_of_new_id_honours_explicit_and_root_parent(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("a"), text_message("b"), text_message("c")])
    session.upsert_message(text_message("x"), parent_id="a")
    session.upsert_message(text_message("r"), parent_id=None)
    session.upsert_message(text_message("u"), parent_id="unknown")

    parents = {r["id"]: r["parent_id"] for r in message_rows(data_dir, object_key)}
    assert parents == {"a": None, "b": "a", "c": "b", "x": "a", "r": None, "u": None}
    assert session.get_latest_leaf()["id"] == "u"


def test_upsert_of_existing_id_updates_without_reparenting(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("a"), text_message("b"), text_message("c")])
    before = message_row(data_dir, object_key, "c")
    assert before is not None

    result = session.upsert_message(text_message("c", "edited"), parent_id="a")

    assert (result.inserted, result.changed) == (False, True)
    assert result.message == text_message("c", "edited")
    after = message_row(data_dir, object_key, "c")
    assert after is not None
    assert after["content"] == js_json(text_message("c", "edited"))
    assert (after["parent_id"], after["seq"], after["created_at"]) == ("b", before["seq"], before["created_at"])
    assert len(message_rows(data_dir, object_key)) == 3

    result = session.upsert_message(text_message("c", "edited"), parent_id=None)
    assert (result.inserted, result.changed) == (False, False)
    assert message_row(data_dir, object_key, "c")["parent_id"] == "b"  # type: ignore[index]


def test_unchanged_upsert_writes_nothing(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    before = message_rows(data_dir, object_key)
    with commit_watch(data_dir, object_key) as committed:
        result = session.upsert_message(text_message("a"))
        assert not committed()
    assert (result.inserted, result.changed) == (False, False)
    assert message_rows(data_dir, object_key) == before


def test_upsert_strips_reserved_metadata_for_client(session: Any, data_dir: Path, object_key: str) -> None:
    session.upsert_message(text_message("a", metadata={"channel": "x", "k": 1}), source="client")
    session.upsert_message(text_message("b", metadata={"channel": "x", "k": 1}))
    session.upsert_message(text_message("b", "2", metadata={"channel": "y"}), source="client")
    rows = {r["id"]: r["content"] for r in message_rows(data_dir, object_key)}
    assert rows["a"] == js_json(text_message("a", metadata={"k": 1}))
    assert rows["b"] == js_json(text_message("b", "2"))


def test_upsert_of_overlay_id_writes_nothing(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    result = session.upsert_message(text_message("compaction_1", "s", role="assistant"), source="client")
    assert result.inserted is False
    assert ids(message_rows(data_dir, object_key)) == ["a"]
