"""Point reads, branches, history paths (forward, newest first, other leaves) and row stats
(reference notes §6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import (
    ids,
    js_json,
    message_rows,
    stored_json,
    text_message,
    utf8_len,
)


def build_tree(session: Any) -> None:
    """The tree a-b-c-d plus x-y under b (y is the newest row, so the active leaf)."""
    session.append_messages([text_message(i, f"text {i}") for i in "abcd"])
    session.append_message(text_message("x", "text x"), parent_id="b")
    session.append_message(text_message("y", "text y"))


# ── point reads ─────────────────────────────────────────────────────────────


def test_get_message(obj: Any) -> None:
    session = obj.session()
    message = text_message("a", "héllo 😀", metadata={"k": [1, 2]})
    session.append_message(message)
    obj.session("other").append_message(text_message("o"))

    assert session.get_message("a") == message
    assert session.get_message("missing") is None
    assert session.get_message("o") is None  # other session
    assert session.get_message("") is None


def test_get_messages_keeps_request_order(session: Any) -> None:
    session.append_messages([text_message(i) for i in "abc"])
    got = session.get_messages(["c", "missing", "a"])
    assert got == [text_message("c"), None, text_message("a")]
    # Ids from an iterator are read once: the answer was [] (the request took them all).
    assert session.get_messages(i for i in ["c", "missing", "a"]) == got


def test_get_latest_leaf(session: Any) -> None:
    assert session.get_latest_leaf() is None
    build_tree(session)
    assert session.get_latest_leaf() == text_message("y", "text y")


def test_get_branches_in_seq_order(session: Any) -> None:
    session.append_message(text_message("p"))
    for child in ("z", "a", "m"):
        session.append_message(text_message(child), parent_id="p")
    session.append_message(text_message("n"), parent_id="z")

    assert ids(session.get_branches("p")) == ["z", "a", "m"]
    assert session.get_branches("p")[0] == text_message("z")
    assert ids(session.get_branches("z")) == ["n"]
    assert session.get_branches("m") == []
    assert session.get_branches("unknown") == []


# ── history ─────────────────────────────────────────────────────────────────


def test_history_follows_the_active_leaf(session: Any) -> None:
    build_tree(session)
    history = session.get_history()
    assert ids(history) == ["a", "b", "x", "y"]
    assert history[0] == text_message("a", "text a")


def test_history_newest_first_is_the_exact_reverse(session: Any) -> None:
    build_tree(session)
    forward = session.get_history()
    backward = session.get_history(newest_first=True)
    assert backward == list(reversed(forward))
    assert ids(session.get_history(leaf_id="d", newest_first=True)) == ["d", "c", "b", "a"]


def test_newest_first_can_stop_after_the_leaf(session: Any) -> None:
    build_tree(session)
    stream = session.history(newest_first=True)
    assert next(stream)["id"] == "y"
    stream.close()


def test_history_of_another_branch(session: Any) -> None:
    build_tree(session)
    assert ids(session.get_history(leaf_id="d")) == ["a", "b", "c", "d"]
    assert ids(session.get_history(leaf_id="c")) == ["a", "b", "c"]
    assert ids(session.get_history(leaf_id="a")) == ["a"]


def test_unknown_leaf_reads_nothing(session: Any) -> None:
    build_tree(session)
    assert session.get_history(leaf_id="nope") == []
    assert session.get_history(leaf_id="nope", newest_first=True) == []
    assert session.get_recent_history(10**9, leaf_id="nope").messages == []
    assert session.get_history_row_stats(leaf_id="nope") == []


def test_empty_leaf_id_means_the_active_leaf(session: Any, stub: Any, object_key: str) -> None:
    build_tree(session)
    assert ids(session.get_history(leaf_id="")) == ["a", "b", "x", "y"]
    request = pb.StreamHistoryRequest(object_key=object_key, session_id="", leaf_id="")
    frames = list(stub.StreamHistory(request))
    assert [f.frame.info.id for f in frames] == ["a", "b", "x", "y"]
    assert [f.frame.json for f in frames][-1] == js_json(text_message("y", "text y"))


def test_history_of_an_empty_session(session: Any) -> None:
    assert session.get_history() == []
    assert session.get_history(newest_first=True) == []
    assert list(session.history_batches()) == []


def test_history_frames_carry_row_facts(session: Any, stub: Any, object_key: str, data_dir: Path) -> None:
    build_tree(session)
    rows = {r["id"]: r for r in message_rows(data_dir, object_key)}
    request = pb.StreamHistoryRequest(object_key=object_key)
    responses = list(stub.StreamHistory(request))
    assert [r.frame.info.id for r in responses] == ["a", "b", "x", "y"]  # the active leaf's path
    for response in responses:
        info = response.frame.info
        row = rows[info.id]
        assert info.role == row["role"]
        assert info.seq == row["seq"]
        assert (info.parent_id if info.HasField("parent_id") else None) == row["parent_id"]
        assert info.created_at_ms == row["created_at"]
        assert info.token_estimate == row["token_estimate"]
        assert response.frame.json == row["content"]
        assert not response.frame.more_pieces


# ── row stats ───────────────────────────────────────────────────────────────


def test_row_stats_along_the_path(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a", "hello"))
    session.append_message(text_message("b", "é😀" * 1_000_000, role="assistant"))  # 6 MB: continuations
    session.append_message({"id": "c", "role": "user", "parts": []})

    stats = session.get_history_row_stats()

    assert [(s.id, s.role, s.token_estimate) for s in stats] == [
        ("a", "user", 6),
        ("b", "assistant", 750_004),  # 4 + 3,000,000 UTF-16 units / 4 (observed on upstream)
        ("c", "user", 4),
    ]
    for stat in stats:
        assert stat.bytes == utf8_len(stored_json(data_dir, object_key, stat.id))
    assert stats[0].bytes == len('{"id":"a","role":"user","parts":[{"type":"text","text":"hello"}]}')
    assert stats[1].bytes == 6_000_065  # observed on upstream
    assert [s.id for s in session.get_history_row_stats(leaf_id="b")] == ["a", "b"]
