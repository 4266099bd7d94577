"""Sessions inside one object are isolated (reference notes §10, §12): the same message id can
live in two sessions, and writes and reads in one never touch the other."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import chunk_rows, ids, js_json, message_row, message_rows, text_message


def test_same_id_in_two_sessions(obj: Any, data_dir: Path, object_key: str) -> None:
    one, two = obj.session("one"), obj.session("two")
    first = one.append_message(text_message("m", "in one"))
    second = two.append_message(text_message("m", "in two"))

    assert first.inserted and second.inserted
    assert one.get_message("m") == text_message("m", "in one")
    assert two.get_message("m") == text_message("m", "in two")
    assert message_row(data_dir, object_key, "m", "one")["seq"] == 1  # type: ignore[index]
    assert message_row(data_dir, object_key, "m", "two")["seq"] == 1  # type: ignore[index]
    # both live in the object's one file
    assert [(r["session_id"], r["id"]) for r in message_rows(data_dir, object_key, None)] == [
        ("one", "m"),
        ("two", "m"),
    ]


def test_updates_deletes_and_clear_are_per_session(obj: Any, data_dir: Path, object_key: str) -> None:
    default, one, two = obj.session(), obj.session("one"), obj.session("two")
    for session in (default, one, two):
        session.append_messages([text_message("a"), text_message("b"), text_message("c", "x" * 2_000_000)])

    one.update_message(text_message("a", "changed in one"))
    assert default.get_message("a") == text_message("a")
    assert two.get_message("a") == text_message("a")
    assert message_row(data_dir, object_key, "a", "one")["content"] == js_json(  # type: ignore[index]
        text_message("a", "changed in one")
    )

    assert two.delete_messages(["b"]) == 1
    assert ids(two.get_history()) == ["a", "c"]
    assert ids(one.get_history()) == ["a", "b", "c"]
    assert ids(default.get_history()) == ["a", "b", "c"]

    assert one.clear_messages() == 3
    assert one.get_history() == []
    assert ids(default.get_history()) == ["a", "b", "c"]
    assert ids(two.get_history()) == ["a", "c"]
    assert sorted((c["session_id"], c["id"]) for c in chunk_rows(data_dir, object_key, None)) == [
        ("", "c"),
        ("two", "c"),
    ]


def test_parents_leaves_and_branches_are_per_session(obj: Any) -> None:
    one, two = obj.session("one"), obj.session("two")
    one.append_messages([text_message("a"), text_message("b")])
    two.append_messages([text_message("x")])
    two.append_message(text_message("y"), parent_id="a")  # "a" exists only in session one

    assert one.get_latest_leaf()["id"] == "b"
    assert two.get_latest_leaf()["id"] == "y"
    assert ids(two.get_history()) == ["y"]
    assert ids(one.get_branches("a")) == ["b"]
    assert two.get_branches("a") == []
    assert one.get_history(leaf_id="y") == []
    assert [s.id for s in two.get_history_row_stats()] == ["y"]


def test_same_session_id_in_two_objects_is_independent(client: Any, object_key: str) -> None:
    a = client.object(object_key + "-a").session("s")
    b = client.object(object_key + "-b").session("s")
    a.append_message(text_message("m", "a"))
    assert b.get_message("m") is None
    b.append_message(text_message("m", "b"))
    assert a.get_message("m") == text_message("m", "a")
    assert b.get_message("m") == text_message("m", "b")


def test_odd_session_ids(obj: Any, data_dir: Path, object_key: str) -> None:
    for session_id in ("", " ", "../x", "ü😀", "a\x00b", "-"):
        obj.session(session_id).append_message(text_message("m", repr(session_id)))
    for session_id in ("", " ", "../x", "ü😀", "a\x00b", "-"):
        assert obj.session(session_id).get_history() == [text_message("m", repr(session_id))]
    assert len(message_rows(data_dir, object_key, None)) == 6


def test_a_page_of_long_session_ids_stays_within_a_response(obj: Any, stub: Any, object_key: str) -> None:
    """Session ids run to 1 KiB and a page to 10,000 of them: a page is cut at a response's budget
    (before, 3,200 ids of 1,000 bytes made a 3.3 MB page and 10,000 of them a 10 MB one, which the
    server could not send), and paging still lists every session once, in order."""
    session_ids = [f"{i:05d}-" + "s" * 994 for i in range(3_200)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda sid: obj.session(sid).append_message(text_message("m")), session_ids))

    listed: list[str] = []
    token = ""
    pages = 0
    while True:
        response = stub.ListSessions(
            pb.ListSessionsRequest(object_key=object_key, page_size=10_000, page_token=token),
            metadata=routing_metadata(object_key),
        )
        assert response.ByteSize() <= 3 * 1024 * 1024
        listed += [s.session_id for s in response.sessions]
        assert all(s.message_count == 1 for s in response.sessions)
        pages += 1
        token = response.next_page_token
        if not token:
            break
    assert pages == 2
    assert listed == session_ids


def test_page_tokens_the_server_never_issued_are_refused(obj: Any, stub: Any, object_key: str) -> None:
    """A mistyped or foreign token is refused, not read as some other position: the lenient
    base64 decoder turned `!!` into the empty id (a page that skipped session ""), and a token
    that is no object file name gave ListObjects an empty page that looked like the end. A page
    ending with session "" has a token too (it was empty: the listing stopped there). A token
    naming a lone surrogate reached SQLite, which failed on it (INTERNAL)."""
    for session_id in ("", "a", "b"):
        obj.session(session_id).append_message(text_message("m"))
    for token in ("!!", "YQ", "a b", "not-a-token", "czHtoIA="):  # the last: "s1" and a lone surrogate's bytes
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListSessions(
                pb.ListSessionsRequest(object_key=object_key, page_token=token), metadata=routing_metadata(object_key)
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, token
        assert "page_token is not one this server issued" in caught.value.details()
    for token in ("zzz", "not-a-token", "A" * 64 + ".sqlite", "0" * 64 + ".db"):
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListObjects(pb.ListObjectsRequest(page_token=token))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, token
    # A token of the servers before listings' fingerprints ("s:" and the id): start again.
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListSessions(
            pb.ListSessionsRequest(object_key=object_key, page_token="czph"), metadata=routing_metadata(object_key)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "issued by an earlier version of this server: start the listing again" in (caught.value.details() or "")
    first = stub.ListSessions(
        pb.ListSessionsRequest(object_key=object_key, page_size=1), metadata=routing_metadata(object_key)
    )
    rest = stub.ListSessions(
        pb.ListSessionsRequest(object_key=object_key, page_token=first.next_page_token),
        metadata=routing_metadata(object_key),
    )
    assert [s.session_id for s in (*first.sessions, *rest.sessions)] == ["", "a", "b"]
    other_key = f"{object_key}-other"
    for session_id in ("", "a", "b"):
        stub.AppendMessage(
            pb.AppendMessageRequest(
                object_key=other_key, session_id=session_id, message_json='{"id":"m","role":"user","parts":[]}'
            ),
            metadata=routing_metadata(other_key),
        )
    # A token names a position in one object's listing: with another object it read that
    # position there. It is refused.
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListSessions(
            pb.ListSessionsRequest(object_key=other_key, page_token=first.next_page_token),
            metadata=routing_metadata(other_key),
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token belongs to a listing of another object" in (caught.value.details() or "")
    objects = stub.ListObjects(pb.ListObjectsRequest(page_size=1))
    assert objects.next_page_token  # the session-scoped server holds other tests' objects too
    following = stub.ListObjects(pb.ListObjectsRequest(page_size=1, page_token=objects.next_page_token))
    assert following.object_keys and following.object_keys[0] != objects.object_keys[0]
