"""Attachments on the read side (issue 5): pointer mode on every read RPC, ReadAttachment (frames
within the default 4 MiB receive limit, NOT_FOUND, INVALID_ARGUMENT), and the byte charge a
referenced payload adds to row stats and recent-history budgets (4·⌈bytes/3⌉, reference notes §4).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import ImportItem, SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from tests.service.chat_completions_stub import FeedReader
from tests.service.support import FRAME_LIMIT_BYTES, error_reason, message_row, text_message
from tests.service.test_attachments import b64, file_part, image_message, payload, pointer, sha


def routing(key: str) -> tuple[tuple[str, str], ...]:
    return (("x-object-key", key),)


def charge(size: int) -> int:
    """What a referenced payload adds to a row's stat bytes: its base64 length."""
    return 4 * math.ceil(size / 3)


@pytest.fixture
def image_chain(session: Any) -> dict[str, Any]:
    """root (text) → img (image) → tool (media in a tool output) → leaf (text); plus a branch
    `alt` (image) under root."""
    image, shot, alt = payload(30_000, 1), payload(20_000, 2), payload(10_000, 3)
    output = {"type": "content", "value": [{"type": "media", "mediaType": "image/png", "data": b64(shot)}]}
    messages = {
        "root": text_message("root", "start"),
        "img": image_message("img", file_part(image)),
        "tool": {
            "id": "tool",
            "role": "assistant",
            "parts": [{"type": "tool-shot", "toolCallId": "c1", "state": "output-available", "output": output}],
        },
        "leaf": text_message("leaf", "done", role="assistant"),
        "alt": image_message("alt", file_part(alt)),
    }
    for name in ("root", "img", "tool", "leaf"):
        session.append_message(messages[name])
    session.append_message(messages["alt"], parent_id="root")
    session.append_message(text_message("after-alt", "x"), parent_id="leaf")  # active leaf back on main
    return {"messages": messages, "payloads": {"img": image, "tool": shot, "alt": alt}}


def _pointer_of(message: dict[str, Any]) -> str | None:
    for part in message["parts"]:
        if part["type"] == "file":
            return str(part["url"])
        if part["type"].startswith("tool-"):
            return str(part["output"]["value"][0]["data"])
    return None


def _assert_pointer_forms(messages: list[dict[str, Any]], chain: dict[str, Any]) -> None:
    assert messages
    for message in messages:
        data = chain["payloads"].get(message["id"])
        if data is not None:
            assert _pointer_of(message) == pointer(data), message["id"]
            assert len(str(message)) < 1024


def _assert_inline_forms(messages: list[dict[str, Any]], chain: dict[str, Any]) -> None:
    for message in messages:
        original = chain["messages"].get(message["id"])
        if original is not None:
            assert message == original


def test_pointer_mode_on_every_read(session: Any, image_chain: dict[str, Any]):
    main = ["root", "img", "tool", "leaf", "after-alt"]
    reads = {
        "get_message": lambda p: [session.get_message("img", pointers=p), session.get_message("tool", pointers=p)],
        "get_messages": lambda p: session.get_messages(["img", "tool", "alt"], pointers=p),
        "get_latest_leaf": lambda p: [session.get_latest_leaf(pointers=p)],
        "get_branches": lambda p: session.get_branches("root", pointers=p),
        "history": lambda p: session.get_history(pointers=p),
        "history_newest_first": lambda p: session.get_history(newest_first=True, pointers=p),
        "history_branch_leaf": lambda p: session.get_history(leaf_id="alt", pointers=p),
        "batches": lambda p: [m for b in session.history_batches(batch_size=2, pointers=p) for m in b],
        "batches_newest_first": lambda p: [
            m for b in session.history_batches(batch_size=2, newest_first=True, pointers=p) for m in b
        ],
        "recent_history": lambda p: session.get_recent_history(10**9, pointers=p).messages,
    }
    for name, read in reads.items():
        pointed, inline = read(True), read(False)
        assert [m["id"] for m in pointed] == [m["id"] for m in inline], name
        _assert_pointer_forms(pointed, image_chain)
        _assert_inline_forms(inline, image_chain)
        if name == "history":
            assert [m["id"] for m in pointed] == main
        if name == "get_latest_leaf":
            assert pointed[0]["id"] == "after-alt"
        if name == "get_branches":
            assert [m["id"] for m in pointed] == ["img", "alt"]


def test_pointer_mode_history_transfers_kilobytes_not_images(session: Any):
    for index in range(5):
        session.append_message(image_message(f"m{index}", file_part(payload(400_000, 10 + index))))
    pointed = session.get_history(pointers=True)
    inline = session.get_history()
    assert sum(len(str(m)) for m in pointed) < 5 * 1024
    assert sum(len(str(m)) for m in inline) > 5 * 500_000


def test_change_feed_pointer_mode(live_server: Any, session: Any, object_key: str):
    data = payload(5000, 20)
    message = image_message("m", file_part(data))
    with (
        FeedReader(live_server.address, object_key, pointers=True) as pointed,
        FeedReader(live_server.address, object_key) as inline,
    ):
        session.append_message(message)
        event = pointed.until("append")
        assert event.message is not None and event.message["parts"][1]["url"] == pointer(data)
        assert inline.until("append").message == message


def test_change_feed_inline_mode_puts_back_the_media_of_pointers_a_writer_sent(
    live_server: Any, session: Any, object_key: str
):
    """A message written naming a payload the object holds by its pointer (copied from a
    POINTER read, say): an INLINE read gives it with the media put back, and its change events
    (append, update, upsert) gave the bare pointer, where only a repeat of the append's id had
    it restored."""
    data = payload(5000, 21)
    session.append_message(image_message("holder", file_part(data)))  # the object holds the payload
    by_pointer = {"type": "file", "mediaType": "image/png", "url": pointer(data)}
    more = {"type": "text", "text": "more"}
    named = image_message("named", by_pointer)
    restored = image_message("named", file_part(data))
    with FeedReader(live_server.address, object_key) as inline:
        session.append_message(named)
        appended = inline.until("append")
        session.update_message({**named, "parts": [*named["parts"], more]})
        update = inline.until("update")
        session.upsert_message(image_message("upserted", by_pointer))
        upserted = inline.until("append")
        session.import_messages([ImportItem(image_message("imported", by_pointer), None, 1_700_000_000_001)])
        imported = inline.until("import")
    assert session.get_message("named") == {**restored, "parts": [*restored["parts"], more]}
    assert appended.message == restored
    assert update.message == {**restored, "parts": [*restored["parts"], more]}
    assert upserted.message == image_message("upserted", file_part(data))
    assert imported.message == image_message("imported", file_part(data))


def test_read_attachment_returns_type_size_and_exact_bytes(obj: Any, session: Any):
    data = payload(70_000, 21)
    session.append_message(image_message("m", file_part(data, "image/webp")))
    attachment = obj.read_attachment(sha(data))
    assert (attachment.hash, attachment.media_type, attachment.data) == (sha(data), "image/webp", data)


def test_read_attachment_of_a_5_mb_payload_in_frames_within_4_mib(
    obj: Any, session: Any, object_key: str, stub: sessions_pb2_grpc.SessionServiceStub
):
    data = payload(5_000_000, 22)
    session.append_message(image_message("big", file_part(data, "video/mp4")))
    frames = list(
        stub.ReadAttachment(
            pb.ReadAttachmentRequest(object_key=object_key, hash=sha(data)), metadata=routing(object_key)
        )
    )
    assert len(frames) >= 2
    assert all(frame.ByteSize() <= FRAME_LIMIT_BYTES for frame in frames)
    assert (frames[0].media_type, frames[0].size_bytes) == ("video/mp4", 5_000_000)
    assert b"".join(frame.data for frame in frames) == data
    # The message itself stays small in pointer mode, and whole inline.
    assert len(str(session.get_message("big", pointers=True))) < 1024
    assert session.get_message("big")["parts"][1]["url"] == file_part(data, "video/mp4")["url"]


def test_read_attachment_of_an_empty_payload(
    obj: Any, session: Any, stub: sessions_pb2_grpc.SessionServiceStub, object_key: str
):
    session.append_message(
        image_message("e", {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,"})
    )
    frames = list(
        stub.ReadAttachment(
            pb.ReadAttachmentRequest(object_key=object_key, hash=sha(b"")), metadata=routing(object_key)
        )
    )
    assert (frames[0].media_type, frames[0].size_bytes) == ("image/png", 0)
    assert b"".join(frame.data for frame in frames) == b""
    assert obj.read_attachment(sha(b"")).data == b""


def test_read_attachment_unknown_hash_is_not_found(obj: Any, session: Any):
    session.append_message(text_message("m"))
    with pytest.raises(SessionsError) as caught:
        obj.read_attachment("0" * 64)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert caught.value.reason == "NOT_FOUND"


def test_read_attachment_of_a_collected_payload_is_not_found(obj: Any, session: Any):
    data = payload(1000, 23)
    session.append_message(image_message("m", file_part(data)))
    session.delete_messages(["m"])
    with pytest.raises(SessionsError) as caught:
        obj.read_attachment(sha(data))
    assert caught.value.code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("digest", ["", "abc", "A" * 64, "g" * 64, "0" * 63, "0" * 65, "attachment:sha256:" + "0" * 64])
def test_read_attachment_malformed_hash_is_invalid_argument(
    stub: sessions_pb2_grpc.SessionServiceStub, object_key: str, digest: str
):
    with pytest.raises(grpc.RpcError) as caught:
        list(
            stub.ReadAttachment(
                pb.ReadAttachmentRequest(object_key=object_key, hash=digest), metadata=routing(object_key)
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(caught.value) == "INVALID_FIELD"


# ── byte charges ────────────────────────────────────────────────────────────


def test_row_stat_bytes_charge_each_referenced_payload(session: Any, object_key: str, data_dir: Path):
    data = payload(600_000, 30)
    session.append_message(text_message("t", "plain"))
    session.append_message(image_message("img", file_part(data)))
    session.append_message(image_message("twice", file_part(data), file_part(data)))  # one distinct hash
    two = payload(1000, 31)
    session.append_message(image_message("two", file_part(data), file_part(two)))
    stats = {s.id: s.bytes for s in session.get_history_row_stats()}

    def row_bytes(message_id: str) -> int:
        row = message_row(data_dir, object_key, message_id)
        assert row is not None
        return len(row["content"].encode())

    assert stats["t"] == row_bytes("t")
    assert stats["img"] == row_bytes("img") + charge(600_000)
    assert stats["img"] > 700_000
    assert stats["twice"] == row_bytes("twice") + charge(600_000)
    assert stats["two"] == row_bytes("two") + charge(600_000) + charge(1000)
    recent = session.get_recent_history(10**9)
    assert recent.total_content_bytes == sum(stats.values())


def test_recent_history_budget_counts_payload_bytes(session: Any):
    for index in range(8):
        session.append_message(image_message(f"i{index}", file_part(payload(400_000, 40 + index))))
    recent = session.get_recent_history(1_500_000)
    assert 1 <= len(recent.messages) <= 3
    assert recent.truncated
    assert [m["id"] for m in recent.messages] == [f"i{i}" for i in range(8 - len(recent.messages), 8)]
    stats = session.get_history_row_stats()
    kept = stats[-len(recent.messages) :]
    assert sum(s.bytes for s in kept) <= 1_500_000
    assert sum(s.bytes for s in stats[-len(recent.messages) - 1 :]) > 1_500_000
    # Pointer mode picks the same window.
    assert [m["id"] for m in session.get_recent_history(1_500_000, pointers=True).messages] == [
        m["id"] for m in recent.messages
    ]
