"""ImportMessages (reference notes §11): verbatim rows with an explicit parent and created time,
the imported row becomes the active leaf, duplicates are skipped, large messages are chunked.

Expected rows were observed on upstream's importMessage."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import ImportItem, ImportResult, SessionsError
from sessions_client._common import IMPORT_FRAME_BYTES, import_frames, import_result
from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import (
    ROW_BUDGET_BYTES,
    chunk_rows,
    error_reason,
    ids,
    js_json,
    message_row,
    message_rows,
    sha256_hex,
    stored_json,
    text_message,
    utf8_len,
    violated_field,
)

UNSANITIZED: dict[str, Any] = {
    "id": "imp",
    "role": "assistant",
    "parts": [
        {"type": "reasoning", "text": ""},
        {"type": "text", "text": "hello", "providerMetadata": {"openai": {"itemId": "x"}}, "z": 1},
    ],
    "metadata": {"channel": "c"},
}


def test_an_import_source_that_fails_raises_its_own_error(session: Any) -> None:
    """What the caller's items raise while the stream is sent (its iterator failing, say while
    it reads another server's history; a message JSON cannot hold) is raised as itself: gRPC
    reported only UNKNOWN "Exception iterating requests!", a status no server sent, without
    the cause."""

    def source() -> Any:
        yield text_message("a")
        raise RuntimeError("the source server went away")

    with pytest.raises(RuntimeError, match="the source server went away"):
        session.import_messages(source())
    with pytest.raises(ValueError, match="JSON"):
        session.import_messages([text_message("b"), {**text_message("c"), "score": float("nan")}])
    with pytest.raises(ValueError, match="JSON"):
        session.import_messages(iter([{**text_message("c"), "score": float("nan")}]))
    assert session.get_message("c") is None
    assert session.import_messages([text_message("d")]).imported == 1


def test_import_is_verbatim_with_explicit_parent_and_created_at(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message(i) for i in "abc"])

    assert session.import_message(UNSANITIZED, parent_id="a", created_at=1_700_000_000_123) is True

    row = message_row(data_dir, object_key, "imp")
    assert row is not None
    # no sanitize (provider ids, empty reasoning part, key order kept), no reserved-key strip
    assert row["content"] == (
        '{"id":"imp","role":"assistant","parts":[{"type":"reasoning","text":""},{"type":"text","text":"hello",'
        '"providerMetadata":{"openai":{"itemId":"x"}},"z":1}],"metadata":{"channel":"c"}}'
    )
    assert row["parent_id"] == "a"
    assert row["created_at"] == 1_700_000_000_123
    assert row["seq"] == 4
    assert row["token_estimate"] == 6
    assert row["content_hash"] == sha256_hex(row["content"])
    assert row["role"] == "assistant"
    assert session.get_message("imp") == UNSANITIZED


def test_imported_row_becomes_the_active_leaf(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message(i) for i in "abc"])
    session.import_message(text_message("x"), parent_id="a", created_at=1)

    assert session.get_latest_leaf()["id"] == "x"
    assert ids(session.get_history()) == ["a", "x"]
    nxt = session.append_message(text_message("y"))
    assert nxt.parent_id == "x"
    assert message_row(data_dir, object_key, "y")["seq"] == 5  # type: ignore[index]


def test_import_parent_is_not_validated(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("a"), text_message("b")])
    session.import_message(text_message("orphan"), parent_id="ghost", created_at=2)

    assert message_row(data_dir, object_key, "orphan")["parent_id"] == "ghost"  # type: ignore[index]
    # the path stops at the missing parent (observed on upstream)
    assert ids(session.get_history()) == ["orphan"]
    assert [s.id for s in session.get_history_row_stats()] == ["orphan"]


def test_import_root_and_datetime_created_at(session: Any, data_dir: Path, object_key: str) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    session.import_message(text_message("r"), parent_id=None, created_at=when)
    row = message_row(data_dir, object_key, "r")
    assert row is not None
    assert row["parent_id"] is None
    assert row["created_at"] == int(when.timestamp() * 1000)


@pytest.mark.parametrize(
    ("created_at", "stored"),
    [
        (2**53, 2**53),
        (2**53 + 1, 2**53),  # the nearest double, as a JS number holds it (observed on upstream)
        (2**53 + 3, 2**53 + 4),
        (-(2**53) - 1, -(2**53)),
        (2**62 + 1, 2**62),
        (2**63 - 1, 2**63 - 1),  # its double, 2^63, is past int64: the largest kept (upstream: a REAL)
        (-(2**53) + 1, -(2**53) + 1),
    ],
)
def test_import_created_at_is_stored_as_a_javascript_number(
    session: Any, data_dir: Path, object_key: str, created_at: int, stored: int
) -> None:
    result = session.import_messages([ImportItem(text_message("r"), None, created_at)])
    assert result.imported == 1
    row = message_row(data_dir, object_key, "r")
    assert row is not None and row["created_at"] == stored


def test_import_does_not_refuse_overlay_ids(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    assert session.import_message(text_message("compaction_q", "compaction_q"), parent_id="a", created_at=5) is True
    assert ids(message_rows(data_dir, object_key)) == ["a", "compaction_q"]
    # with no matching compaction record it is an ordinary visible row
    assert ids(session.get_history()) == ["a", "compaction_q"]
    assert message_row(data_dir, object_key, "compaction_q")["token_estimate"] == 7  # type: ignore[index]


def test_duplicate_import_is_skipped(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("a"), text_message("b")])
    before = message_rows(data_dir, object_key)

    result = session.import_messages(
        [
            ImportItem({**text_message("a"), "x": 1}, None, 6),
            ImportItem(text_message("b", "other"), "a", 7),
        ]
    )

    assert (result.imported, result.skipped) == (0, 2)
    assert message_rows(data_dir, object_key) == before
    assert session.get_latest_leaf()["id"] == "b"
    session.append_message(text_message("c"))
    assert message_row(data_dir, object_key, "c")["seq"] == 3  # type: ignore[index]


def test_import_stream_mixes_new_and_duplicate(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    result = session.import_messages(
        [
            ImportItem(text_message("n1"), "a", 10),
            ImportItem(text_message("a", "dup"), None, 11),
            ImportItem(text_message("n2"), "n1", 12),
        ]
    )
    assert (result.imported, result.skipped) == (2, 1)
    rows = message_rows(data_dir, object_key)
    assert [(r["id"], r["seq"], r["parent_id"], r["created_at"]) for r in rows][1:] == [
        ("n1", 2, "a", 10),
        ("n2", 3, "n1", 12),
    ]
    assert rows[0]["content"] == js_json(text_message("a"))


def test_a_long_import_keeps_order_and_skips_a_stored_id_in_a_later_chunk(
    session: Any, data_dir: Path, object_key: str
) -> None:
    """Messages are written in chunks (IMPORT_CHUNK_MESSAGES, 64): 150 span three, and the
    third meets a stored id, so that chunk goes row by row."""
    session.append_message(text_message("m140", "stored first"))
    items = [ImportItem(text_message(f"m{i:03d}"), f"m{i - 1:03d}" if i else None, 1_000 + i) for i in range(150)]
    items[140] = ImportItem(text_message("m140", "imported"), "m139", 1_140)
    result = session.import_messages(items)

    assert (result.imported, result.skipped) == (149, 1)
    rows = message_rows(data_dir, object_key)
    expected = [(f"m{i:03d}", f"m{i - 1:03d}" if i else None, 1_000 + i) for i in range(150) if i != 140]
    assert [(r["id"], r["parent_id"], r["created_at"]) for r in rows[1:]] == expected
    assert [r["seq"] for r in rows] == list(range(1, 151))
    assert message_row(data_dir, object_key, "m140")["content"] == js_json(text_message("m140", "stored first"))  # type: ignore[index]
    assert session.get_latest_leaf()["id"] == "m149"


def test_messages_before_a_bad_one_are_imported(session: Any, data_dir: Path, object_key: str) -> None:
    """An import is not all or nothing (the contract): what came before the bad message is
    written, and the import answers the bad message's error."""
    good = [ImportItem(text_message(f"g{i}"), f"g{i - 1}" if i else None, 10 + i) for i in range(3)]
    with pytest.raises(SessionsError) as caught:
        session.import_messages([*good, ImportItem('{"id":"bad","role":"user"}', "g2", 13)])

    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # The error says so, and how to finish (it said only what was wrong with the message).
    assert caught.value.message.startswith("the import's message 3 (counting from 0): ")
    assert caught.value.message.endswith(
        "; the 3 messages before it are stored (an import is not all or nothing): send the import again once "
        "this message is fixed, ids already stored are skipped"
    )
    assert [(r["id"], r["seq"]) for r in message_rows(data_dir, object_key)] == [("g0", 1), ("g1", 2), ("g2", 3)]
    assert ids(session.get_history()) == ["g0", "g1", "g2"]


def test_a_bad_first_message_stores_nothing_and_says_so(session: Any, data_dir: Path, object_key: str) -> None:
    with pytest.raises(SessionsError) as caught:
        session.import_messages(
            [ImportItem('{"id":"bad","role":"user"}', None, 1), ImportItem(text_message("g"), None, 2)]
        )
    assert "nothing of this import is stored: send the import again once" in caught.value.message
    assert message_rows(data_dir, object_key) == []


def test_plain_messages_import_as_a_chain(session: Any, data_dir: Path, object_key: str) -> None:
    result = session.import_messages([text_message("m1"), text_message("m2"), text_message("m3")])
    assert (result.imported, result.skipped) == (3, 0)
    rows = message_rows(data_dir, object_key)
    assert [(r["id"], r["seq"], r["parent_id"]) for r in rows] == [("m1", 1, None), ("m2", 2, "m1"), ("m3", 3, "m2")]
    assert ids(session.get_history()) == ["m1", "m2", "m3"]


def test_empty_import_is_fine(session: Any) -> None:
    result = session.import_messages([])
    assert (result.imported, result.skipped) == (0, 0)
    assert session.get_history() == []


def test_large_import_is_chunked(session: Any, data_dir: Path, object_key: str) -> None:
    three_mb = text_message("big", "t" * 3_000_000)
    larger = text_message("bigger", "好😀" * 600_000)  # 4.2 MB: sent in several stream pieces
    result = session.import_messages([ImportItem(three_mb, None, 1), ImportItem(larger, "big", 2)])
    assert (result.imported, result.skipped) == (2, 0)

    for message, continuations in ((three_mb, 1), (larger, 2)):
        text = js_json(message)
        row = message_row(data_dir, object_key, message["id"])
        assert row is not None
        assert row["content_chunks"] == continuations
        assert stored_json(data_dir, object_key, message["id"]) == text
        assert row["content_hash"] == sha256_hex(text)
        assert all(utf8_len(c["content"]) <= ROW_BUDGET_BYTES for c in chunk_rows(data_dir, object_key))
        assert utf8_len(row["content"]) <= ROW_BUDGET_BYTES
    assert session.get_message("bigger") == larger
    assert session.get_history() == [three_mb, larger]


def _whole(message_id: str, parent_id: str | None, created_at_ms: int) -> pb.ImportedMessage:
    whole = pb.ImportedMessage(json=js_json(text_message(message_id)), created_at_ms=created_at_ms)
    if parent_id is not None:
        whole.parent_id = parent_id
    return whole


def test_packed_frames_mix_with_pieces_in_order(stub: Any, data_dir: Path, object_key: str) -> None:
    """Whole messages in a frame are imported before the frame's own piece; one frame may hold
    many; the frame's parent and created time belong to its piece's message."""
    big = js_json(text_message("big", "b" * 5_000))
    frames = [
        pb.ImportMessagesRequest(
            object_key=object_key,
            messages=[_whole("w1", None, 1), _whole("w2", "w1", 2)],
            json_piece=big[:3_000],
            more_pieces=True,
            parent_id="w2",
            created_at_ms=3,
        ),
        pb.ImportMessagesRequest(json_piece=big[3_000:]),
        pb.ImportMessagesRequest(messages=[_whole("w3", "big", 4)]),
        pb.ImportMessagesRequest(json_piece=js_json(text_message("p4")), parent_id="w3", created_at_ms=5),
    ]
    response = stub.ImportMessages(iter(frames))

    assert (response.imported_count, response.skipped_count) == (5, 0)
    rows = message_rows(data_dir, object_key)
    assert [(r["id"], r["seq"], r["parent_id"], r["created_at"]) for r in rows] == [
        ("w1", 1, None, 1),
        ("w2", 2, "w1", 2),
        ("big", 3, "w2", 3),
        ("w3", 4, "big", 4),
        ("p4", 5, "w3", 5),
    ]
    assert stored_json(data_dir, object_key, "big") == big


def test_whole_messages_inside_a_pieced_message_are_refused(stub: Any, data_dir: Path, object_key: str) -> None:
    frames = [
        pb.ImportMessagesRequest(object_key=object_key, messages=[_whole("w1", None, 1)]),
        pb.ImportMessagesRequest(json_piece='{"id":"p",', more_pieces=True),
        pb.ImportMessagesRequest(messages=[_whole("w2", "w1", 2)], json_piece='"role":"user","parts":[]}'),
    ]
    with pytest.raises(grpc.RpcError) as caught:
        stub.ImportMessages(iter(frames))

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_reason(caught.value) == "INVALID_STREAM"
    assert violated_field(caught.value) == "messages"
    assert [r["id"] for r in message_rows(data_dir, object_key)] == ["w1"]  # not all or nothing
    # ... and the error says so, as one about a message does.
    assert "; the message before it is stored (an import is not all or nothing)" in caught.value.details()


def test_a_list_is_imported_packed_and_an_iterator_as_it_comes(session: Any, data_dir: Path, object_key: str) -> None:
    """The Python client packs a list (here 300 messages, a 400 KB one among them in pieces)
    and streams an iterator a message a frame; both import the same rows."""
    messages = [text_message(f"l{i:03d}") for i in range(300)]
    messages[150] = text_message("l150", "x" * 400_000)
    assert session.import_messages(messages) == ImportResult(300, 0)
    other = session.object.session("iterated")
    assert other.import_messages(iter(messages)) == ImportResult(300, 0)

    for session_id in ("", "iterated"):
        rows = message_rows(data_dir, object_key, session_id)
        assert [(r["id"], r["seq"], r["parent_id"]) for r in rows] == [
            (f"l{i:03d}", i + 1, f"l{i - 1:03d}" if i else None) for i in range(300)
        ]
    assert session.get_message("l150") == messages[150]


def test_the_client_packs_a_list_and_sends_an_iterator_a_message_a_frame() -> None:
    messages = [text_message(f"m{i:04d}", "t" * 1_000) for i in range(3_000)]  # ~3.2 MB in all
    packed = list(import_frames("k", "", messages))
    assert 3 <= len(packed) <= 5  # frames of about IMPORT_FRAME_BYTES
    assert all(frame.ByteSize() <= IMPORT_FRAME_BYTES + 64 * 1024 for frame in packed)
    assert [m.json for frame in packed for m in frame.messages] == [js_json(m) for m in messages]
    assert (packed[0].object_key, packed[1].object_key) == ("k", "")

    with_large = [*messages[:500], text_message("large", "x" * 3_500_000), *messages[500:600]]
    frames = list(import_frames("k", "", with_large))
    assert max(frame.ByteSize() for frame in frames) <= 3 * 1024 * 1024 + 1024  # a piece alone: none near 4 MiB
    small = [js_json(m) for m in with_large if m["id"] != "large"]
    assert [m.json for frame in frames for m in frame.messages] == small

    streamed = list(import_frames("k", "", iter(messages)))
    assert len(streamed) == 3_000 and not any(frame.messages for frame in streamed)
    assert [frame.json_piece for frame in streamed] == [js_json(m) for m in messages]


def test_counts_that_miss_packed_messages_are_an_error() -> None:
    """A server that predates packed frames reads none of them: the client says so."""
    sent = [text_message("a"), text_message("b"), text_message("c")]
    assert import_result(pb.ImportMessagesResponse(imported_count=2, skipped_count=1), sent) == ImportResult(2, 1)
    with pytest.raises(SessionsError, match="1 of the 3 messages") as caught:
        import_result(pb.ImportMessagesResponse(imported_count=1), sent)
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert import_result(pb.ImportMessagesResponse(imported_count=1), iter(sent)) == ImportResult(1, 0)


def test_a_later_frame_naming_another_session_is_refused(stub: Any, data_dir: Path, object_key: str) -> None:
    """It was imported into the first frame's session, silently."""
    frames = [
        pb.ImportMessagesRequest(object_key=object_key, session_id="a", messages=[_whole("a1", None, 1)]),
        pb.ImportMessagesRequest(session_id="a", messages=[_whole("a2", "a1", 2)]),  # the same: fine
        pb.ImportMessagesRequest(session_id="b", messages=[_whole("b1", None, 3)]),
    ]
    with pytest.raises(grpc.RpcError) as caught:
        stub.ImportMessages(iter(frames))
    assert error_reason(caught.value) == "INVALID_STREAM"
    assert violated_field(caught.value) == "session_id"
    assert "the 2 messages before it are stored" in caught.value.details()
    assert [(r["session_id"], r["id"]) for r in message_rows(data_dir, object_key, None)] == [("a", "a1"), ("a", "a2")]
