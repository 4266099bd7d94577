"""Where appends attach (reference notes §2 step 5, §12): AUTO is the newest row, ROOT starts a
new root, an explicit id is used only when it exists in this session; the response reports the
parent actually used; a branch append becomes the active leaf."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.service.support import ids, message_row, message_rows, text_message


def test_auto_parent_is_the_newest_row(session: Any, data_dir: Path, object_key: str) -> None:
    first = session.append_message(text_message("a"))
    second = session.append_message(text_message("b"))
    third = session.append_message(text_message("c"))

    assert (first.inserted, first.parent_id) == (True, None)
    assert (second.inserted, second.parent_id) == (True, "a")
    assert (third.inserted, third.parent_id) == (True, "b")
    rows = message_rows(data_dir, object_key)
    assert [(r["id"], r["parent_id"]) for r in rows] == [("a", None), ("b", "a"), ("c", "b")]


def test_auto_parent_follows_a_branch_append(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("a"), text_message("b"), text_message("c")])
    session.append_message(text_message("x"), parent_id="a")
    after = session.append_message(text_message("y"))

    assert after.parent_id == "x"
    assert message_row(data_dir, object_key, "y")["parent_id"] == "x"  # type: ignore[index]


def test_root_parent_makes_a_new_root_that_becomes_the_leaf(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("a"), text_message("b")])
    result = session.append_message(text_message("r"), parent_id=None)

    assert result.inserted is True
    assert result.parent_id is None
    assert message_row(data_dir, object_key, "r")["parent_id"] is None  # type: ignore[index]
    assert session.get_latest_leaf()["id"] == "r"
    assert ids(session.get_history()) == ["r"]


def test_explicit_parent_is_used(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("a"), text_message("b"), text_message("c")])
    result = session.append_message(text_message("d"), parent_id="b")

    assert result.parent_id == "b"
    assert message_row(data_dir, object_key, "d")["parent_id"] == "b"  # type: ignore[index]
    assert ids(session.get_history()) == ["a", "b", "d"]


@pytest.mark.parametrize("parent", ["no-such-message", ""], ids=["unknown", "empty-string"])
def test_unknown_or_empty_parent_makes_a_root(session: Any, data_dir: Path, object_key: str, parent: str) -> None:
    session.append_messages([text_message("a"), text_message("b")])
    result = session.append_message(text_message("c"), parent_id=parent)

    assert result.inserted is True
    assert result.parent_id is None
    assert message_row(data_dir, object_key, "c")["parent_id"] is None  # type: ignore[index]
    assert ids(session.get_history()) == ["c"]


def test_parent_from_another_session_makes_a_root(obj: Any, data_dir: Path, object_key: str) -> None:
    other = obj.session("other")
    other.append_message(text_message("p"))
    session = obj.session("main")
    session.append_message(text_message("a"))

    result = session.append_message(text_message("c"), parent_id="p")

    assert result.parent_id is None
    assert message_row(data_dir, object_key, "c", "main")["parent_id"] is None  # type: ignore[index]


def test_branch_append_becomes_the_active_leaf(session: Any) -> None:
    session.append_messages([text_message("a"), text_message("b"), text_message("c")])
    session.append_message(text_message("b2"), parent_id="a")

    assert session.get_latest_leaf()["id"] == "b2"
    assert ids(session.get_history()) == ["a", "b2"]
    assert ids(session.get_history(leaf_id="c")) == ["a", "b", "c"]


# ── the wire: parent modes and the facts returned ───────────────────────────


def append_raw(stub: Any, object_key: str, message_id: str, **fields: Any) -> Any:
    from sessions_proto.v1 import sessions_pb2 as pb

    message_json = f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"hello"}}]}}'
    return stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=message_json, **fields))


def test_parent_modes_on_the_wire(stub: Any, data_dir: Path, object_key: str) -> None:
    from sessions_proto.v1 import sessions_pb2 as pb

    first = append_raw(stub, object_key, "a")  # UNSPECIFIED without an id: AUTO
    second = append_raw(stub, object_key, "b")
    third = append_raw(stub, object_key, "c", parent_id="a")  # UNSPECIFIED with an id: ID
    root = append_raw(stub, object_key, "r", parent_mode=pb.PARENT_MODE_ROOT)
    unknown = append_raw(stub, object_key, "u", parent_mode=pb.PARENT_MODE_ID, parent_id="nope")
    auto = append_raw(stub, object_key, "v", parent_mode=pb.PARENT_MODE_AUTO)

    def parent(response: Any) -> str | None:
        info = response.message.info
        return info.parent_id if info.HasField("parent_id") else None

    assert [parent(r) for r in (first, second, third, root, unknown, auto)] == [None, "a", "a", None, None, "u"]
    stored = {r["id"]: r["parent_id"] for r in message_rows(data_dir, object_key)}
    assert stored == {"a": None, "b": "a", "c": "a", "r": None, "u": None, "v": "u"}

    # A parent named with a mode that takes none is refused, not ignored (ROOT took it silently).
    for mode in (pb.PARENT_MODE_AUTO, pb.PARENT_MODE_ROOT):
        with pytest.raises(grpc.RpcError) as refused:
            append_raw(stub, object_key, "x", parent_mode=mode, parent_id="a")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "parent_id" in (refused.value.details() or "")
    assert "x" not in {r["id"] for r in message_rows(data_dir, object_key)}


def test_append_response_carries_the_stored_row(stub: Any, data_dir: Path, object_key: str) -> None:
    append_raw(stub, object_key, "a")
    response = append_raw(stub, object_key, "b")
    row = message_row(data_dir, object_key, "b")
    assert row is not None
    info = response.message.info
    assert response.inserted is True
    assert (info.id, info.role, info.parent_id, info.seq) == ("b", "user", "a", 2)
    assert (info.created_at_ms, info.token_estimate) == (row["created_at"], 6)
    assert response.message.json == row["content"]
    assert response.message.json_omitted is False

    again = append_raw(stub, object_key, "b", parent_id="b")
    assert again.inserted is False
    assert (again.message.info.seq, again.message.info.parent_id) == (2, "a")
    assert again.message.json == row["content"]
