"""Row budget and continuation rows (reference notes §3), and large messages over the wire
(DESIGN.md §4 framing: no response frame over 4 MiB; writes of any size).

Slice sizes marked "observed" were read from upstream's SQLite file for the same message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessions_client import SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import (
    FRAME_LIMIT_BYTES,
    ROW_BUDGET_BYTES,
    chunk_rows,
    js_json,
    message_of_json_size,
    message_row,
    sha256_hex,
    stored_json,
    text_message,
    utf8_len,
)

TEXT_PREFIX = '{"id":"e","role":"user","parts":[{"type":"text","text":"'


def slice_sizes(data_dir: Path, object_key: str, message_id: str) -> list[int]:
    row = message_row(data_dir, object_key, message_id)
    assert row is not None
    chunks = [c for c in chunk_rows(data_dir, object_key) if c["id"] == message_id]
    assert row["content_chunks"] == len(chunks)
    assert [c["idx"] for c in chunks] == list(range(1, len(chunks) + 1))
    return [utf8_len(row["content"])] + [utf8_len(c["content"]) for c in chunks]


def assert_stored_exactly(data_dir: Path, object_key: str, message: dict[str, Any] | str) -> None:
    text = message if isinstance(message, str) else js_json(message)
    message_id = "e" if isinstance(message, str) else message["id"]
    assert stored_json(data_dir, object_key, message_id) == text
    assert message_row(data_dir, object_key, message_id)["content_hash"] == sha256_hex(text)  # type: ignore[index]
    assert all(size <= ROW_BUDGET_BYTES for size in slice_sizes(data_dir, object_key, message_id))


# ── the row budget ──────────────────────────────────────────────────────────


def test_json_of_exactly_the_budget_is_one_row(session: Any, data_dir: Path, object_key: str) -> None:
    message = message_of_json_size("x", ROW_BUDGET_BYTES)
    session.append_message(message)
    assert slice_sizes(data_dir, object_key, "x") == [ROW_BUDGET_BYTES]
    assert chunk_rows(data_dir, object_key) == []
    assert_stored_exactly(data_dir, object_key, message)


def test_one_byte_over_the_budget_adds_one_continuation(session: Any, data_dir: Path, object_key: str) -> None:
    message = message_of_json_size("x", ROW_BUDGET_BYTES + 1)
    session.append_message(message)
    assert slice_sizes(data_dir, object_key, "x") == [ROW_BUDGET_BYTES, 1]
    assert chunk_rows(data_dir, object_key)[0]["content"] == "}"
    assert_stored_exactly(data_dir, object_key, message)
    assert session.get_message("x") == message


def test_five_million_ascii_characters_take_three_continuations(session: Any, data_dir: Path, object_key: str) -> None:
    message = text_message("big", "a" * 5_000_000)
    session.append_message(message)
    total = utf8_len(js_json(message))
    assert slice_sizes(data_dir, object_key, "big") == [ROW_BUDGET_BYTES] * 3 + [total - 3 * ROW_BUDGET_BYTES]
    assert_stored_exactly(data_dir, object_key, message)
    assert session.get_message("big") == message


@pytest.mark.parametrize(
    ("char", "short_by"),
    [("😀", 1), ("😀", 2), ("😀", 3), ("中", 1), ("中", 2), ("é", 1)],
    ids=["emoji-1", "emoji-2", "emoji-3", "cjk-1", "cjk-2", "latin-1"],
)
def test_a_character_at_the_cut_is_never_split(
    session: Any, data_dir: Path, object_key: str, char: str, short_by: int
) -> None:
    # the character starts `short_by` bytes before the budget, so it would straddle the cut
    filler = ROW_BUDGET_BYTES - short_by - utf8_len(TEXT_PREFIX)
    raw = TEXT_PREFIX + "a" * filler + char + "tail" + '"}]}'
    session.append_message(raw)

    sizes = slice_sizes(data_dir, object_key, "e")
    assert sizes[0] == ROW_BUDGET_BYTES - short_by
    assert chunk_rows(data_dir, object_key)[0]["content"].startswith(char + "tail")
    assert sum(sizes) == utf8_len(raw)
    assert_stored_exactly(data_dir, object_key, raw)


def test_emoji_and_two_byte_text_slices_match_upstream(session: Any, data_dir: Path, object_key: str) -> None:
    message = text_message("b", "é😀" * 1_000_000, role="assistant")
    session.append_message(message)
    assert slice_sizes(data_dir, object_key, "b") == [1_572_861, 1_572_864, 1_572_864, 1_281_476]  # observed
    assert_stored_exactly(data_dir, object_key, message)
    assert session.get_message("b") == message


# ── updates grow and shrink the continuation set ────────────────────────────


def chunk_index(data_dir: Path, object_key: str, message_id: str) -> list[int]:
    return [c["idx"] for c in chunk_rows(data_dir, object_key) if c["id"] == message_id]


def test_update_grows_and_shrinks_continuations(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("m", "tiny"))
    session.append_message(text_message("other", "o" * 2_000_000))  # its chunk must survive
    assert chunk_index(data_dir, object_key, "m") == []

    steps = [("a" * 5_000_000, [1, 2, 3]), ("b" * 2_000_000, [1]), ("tiny again", []), ("c" * 5_000_000, [1, 2, 3])]
    for text, expected in steps:
        message = text_message("m", text)
        assert session.update_message(message) == message
        row = message_row(data_dir, object_key, "m")
        assert row is not None
        assert row["content_chunks"] == len(expected)
        assert chunk_index(data_dir, object_key, "m") == expected
        assert_stored_exactly(data_dir, object_key, message)
        assert row["seq"] == 1
        assert session.get_message("m") == message
        assert chunk_index(data_dir, object_key, "other") == [1]


def test_update_changing_only_the_last_continuation_is_detected(session: Any, data_dir: Path, object_key: str) -> None:
    text = "a" * 5_000_000
    session.append_message(text_message("m", text))
    before = {c["idx"]: c["content"] for c in chunk_rows(data_dir, object_key)}

    changed = text_message("m", text[:-1] + "Z")
    session.update_message(changed)

    after = {c["idx"]: c["content"] for c in chunk_rows(data_dir, object_key)}
    assert after[1] == before[1] and after[2] == before[2]
    assert after[3] != before[3] and after[3].endswith('Z"}]}')
    assert_stored_exactly(data_dir, object_key, changed)


# ── 5,000,000 characters of emoji/CJK end to end ────────────────────────────

HUGE_TEXT = "😀中" * 2_500_000  # 5,000,000 characters, 17.5 MB of UTF-8


@pytest.fixture(scope="module")
def huge_message() -> dict[str, Any]:
    return text_message("huge", HUGE_TEXT, role="assistant")


def join_frames(responses: list[Any], frame_of: Any) -> list[tuple[Any, str]]:
    """(info, json) per message from a stream of responses, checking every frame's size."""
    out: list[tuple[Any, str]] = []
    info, parts = None, []
    for response in responses:
        assert response.ByteSize() <= FRAME_LIMIT_BYTES
        frame = frame_of(response)
        if info is None:
            info = frame.info
        parts.append(frame.json)
        if not frame.more_pieces:
            out.append((info, "".join(parts)))
            info, parts = None, []
    assert parts == []
    return out


def test_huge_message_round_trips_through_the_python_client(
    session: Any, data_dir: Path, object_key: str, huge_message: dict[str, Any]
) -> None:
    session.append_message(text_message("first"))
    result = session.append_message(huge_message)
    assert result.inserted is True
    assert result.parent_id == "first"
    assert result.message == huge_message

    assert_stored_exactly(data_dir, object_key, huge_message)
    assert session.get_message("huge") == huge_message
    assert session.get_latest_leaf() == huge_message
    assert list(session.history_batches(batch_size=1)) == [[text_message("first")], [huge_message]]
    recent = session.get_recent_history(1)
    assert (recent.messages, recent.truncated) == ([huge_message], True)
    again = session.append_message(huge_message)
    assert (again.inserted, again.message) == (False, huge_message)


def test_huge_message_through_a_plain_stub(
    session: Any, stub: Any, data_dir: Path, object_key: str, huge_message: dict[str, Any]
) -> None:
    text = js_json(huge_message)
    # write it through the client-streaming path with the generated stub, header first
    data = text.encode("utf-8")
    pieces, start = [], 0
    while start < len(data):
        end = min(start + 1_000_000, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        pieces.append(data[start:end].decode("utf-8"))
        start = end
    header = pb.UploadHeader(
        object_key=object_key, operation=pb.UPLOAD_OPERATION_APPEND, parent_mode=pb.PARENT_MODE_AUTO
    )
    frames = [pb.UploadMessageRequest(header=header, json_piece=pieces[0])]
    frames += [pb.UploadMessageRequest(json_piece=p) for p in pieces[1:]]
    response = stub.UploadMessage(iter(frames))
    assert response.inserted is True
    assert response.message.info.id == "huge"
    assert response.ByteSize() <= FRAME_LIMIT_BYTES
    assert_stored_exactly(data_dir, object_key, huge_message)
    session.append_message(text_message("after"))

    got = join_frames(
        list(stub.GetMessage(pb.GetMessageRequest(object_key=object_key, message_id="huge"))), lambda r: r.frame
    )
    assert [(info.id, json) for info, json in got] == [("huge", text)]
    assert got[0][0].role == "assistant"

    history = join_frames(list(stub.StreamHistory(pb.StreamHistoryRequest(object_key=object_key))), lambda r: r.frame)
    assert [json for _, json in history] == [text, js_json(text_message("after"))]

    newest = join_frames(
        list(stub.StreamHistory(pb.StreamHistoryRequest(object_key=object_key, newest_first=True))), lambda r: r.frame
    )
    assert [json for _, json in newest] == [js_json(text_message("after")), text]

    many = join_frames(
        list(stub.GetMessages(pb.GetMessagesRequest(object_key=object_key, message_ids=["after", "huge"]))),
        lambda r: r.frame,
    )
    assert sorted(json for _, json in many) == sorted([text, js_json(text_message("after"))])

    recent = list(stub.GetRecentHistory(pb.GetRecentHistoryRequest(object_key=object_key, max_content_bytes=10**9)))
    assert recent[0].HasField("summary")
    assert recent[0].summary.truncated is False
    joined = join_frames([r for r in recent if r.HasField("frame")], lambda r: r.frame)
    assert [json for _, json in joined] == [text, js_json(text_message("after"))]

    stats = [s for r in stub.GetHistoryRowStats(pb.GetHistoryRowStatsRequest(object_key=object_key)) for s in r.stats]
    assert [(s.id, s.bytes) for s in stats] == [
        ("huge", utf8_len(text)),
        ("after", utf8_len(js_json(text_message("after")))),
    ]


def test_large_unary_append_through_a_plain_stub(stub: Any, data_dir: Path, object_key: str) -> None:
    message = text_message("u", "字" * 2_000_000)  # 6 MB request: above the default 4 MiB
    response = stub.AppendMessage(
        pb.AppendMessageRequest(object_key=object_key, message_json=js_json(message), parent_mode=pb.PARENT_MODE_AUTO)
    )
    assert response.inserted is True
    assert response.ByteSize() <= FRAME_LIMIT_BYTES
    assert (response.message.json_omitted, response.message.json) == (True, "")
    assert response.message.json_as_sent is True  # stored byte for byte as sent
    assert_stored_exactly(data_dir, object_key, message)
    leaf = join_frames(list(stub.GetLatestLeaf(pb.GetLatestLeafRequest(object_key=object_key))), lambda r: r.frame)
    assert [json for _, json in leaf] == [js_json(message)]


def test_large_update_and_upsert_through_the_streaming_path(session: Any, data_dir: Path, object_key: str) -> None:
    big = text_message("m", "é" * 2_000_000)  # 4 MB: the client streams it
    before = chunk_rows(data_dir, object_key)
    assert session.update_message(big) is None  # absent id: nothing written
    assert message_row(data_dir, object_key, "m") is None
    assert chunk_rows(data_dir, object_key) == before

    session.append_message(text_message("a"))
    inserted = session.upsert_message(big, parent_id="a")
    assert (inserted.inserted, inserted.changed, inserted.message) == (True, False, big)
    assert_stored_exactly(data_dir, object_key, big)

    changed = text_message("m", "ü" * 2_100_000)
    result = session.upsert_message(changed, parent_id=None)
    assert (result.inserted, result.changed) == (False, True)
    assert message_row(data_dir, object_key, "m")["parent_id"] == "a"  # type: ignore[index]
    assert_stored_exactly(data_dir, object_key, changed)
    assert session.get_message("m") == changed


def _sanitized_away(message_id: str, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A message whose part carries OpenAI's ephemeral item id, and the form the server stores."""
    metadata = {"openai": {"itemId": "item_1"}}
    sent = {
        "id": message_id,
        "role": "assistant",
        "parts": [{"type": "text", "text": text, "providerMetadata": metadata}],
    }
    return sent, {"id": message_id, "role": "assistant", "parts": [{"type": "text", "text": text}]}


def test_an_omitted_message_is_marked_as_sent_only_when_stored_byte_for_byte(stub: Any, object_key: str) -> None:
    """`json_as_sent` tells a client that the omitted JSON is its own; a message the server
    changed (sanitized), or a taken id whose stored message differs, is not marked."""
    sent, stored = _sanitized_away("s", "s" * 5_000_000)

    def append(message: dict[str, Any] | str) -> Any:
        text = message if isinstance(message, str) else js_json(message)
        return stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=text)).message

    changed = append(sent)
    assert (changed.json_omitted, changed.json_as_sent) == (True, False)
    again = append(stored)  # the id is taken by exactly this JSON: the answer is the stored message
    assert (again.json_omitted, again.json_as_sent) == (True, True)
    other = append(text_message("s", "t" * 5_000_000))  # the id is taken by a different message
    assert (other.json_omitted, other.json_as_sent) == (True, False)
    small = append(text_message("small"))
    assert (small.json_omitted, small.json_as_sent) == (False, False)  # the JSON travels: no mark


def test_the_python_client_reads_an_omitted_message_back_only_when_the_server_changed_it(
    session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    get_message = session._client._stub.GetMessage

    def counted(request: Any, **kwargs: Any) -> Any:
        reads.append(request.message_id)
        return get_message(request, **kwargs)

    monkeypatch.setattr(session._client._stub, "GetMessage", counted)
    kept = text_message("kept", "k" * 5_000_000)
    sent, stored = _sanitized_away("changed", "c" * 5_000_000)
    assert session.append_message(kept).message == kept  # as sent: no read back
    assert session.append_message(sent).message == stored  # changed: read back
    assert session.upsert_message(kept).message == kept
    assert [r.message for r in session.append_messages([text_message("a", "a" * 3_000_000), kept])] == [
        text_message("a", "a" * 3_000_000),
        kept,
    ]
    assert reads == ["changed"]


def test_a_large_message_utf8_cannot_carry_raises_as_a_small_one_does(client: Any, object_key: str) -> None:
    """A lone surrogate: a large write (UploadMessage, its pieces made as gRPC sends them) raised
    UNKNOWN "Exception iterating requests!", a status no server sent. Both are refused before
    anything is sent (INVALID_JSON, `test_client_lone_surrogates`)."""
    session = client.object(object_key).session()
    for size in (10, 4 << 20):
        text = '{"id":"a","role":"user","parts":[{"type":"text","text":"' + "x" * size + '\ud800"}]}'
        with pytest.raises(SessionsError, match="lone UTF-16 surrogate"):
            session.append_message(text)
    assert session.get_message("a") is None
