"""Attachments (issue 5; reference notes §4 and §12 "Attachments"): which records are media, the
stored pointer form and payload rows, how reads restore them, and when payloads are collected.

Every test checks the object's SQLite file directly (read-only) besides what the API returns.
"""

from __future__ import annotations

import base64
import hashlib
import random
from pathlib import Path
from typing import Any

import pytest

from sessions_client import ImportItem
from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import js_json, message_row, open_readonly, stored_json, text_message

POINTER = "attachment:sha256:"
CHUNK_BYTES = 1_572_864  # attachment chunks share the row budget
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


# ── builders ────────────────────────────────────────────────────────────────


def payload(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pointer(data: bytes) -> str:
    return POINTER + sha(data)


def file_part(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "file", "mediaType": media_type, "url": f"data:{media_type};base64,{b64(data)}"}


def image_message(message_id: str, *parts: dict[str, Any], text: str = "look at this") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}, *parts]}


def tool_message(message_id: str, output: Any) -> dict[str, Any]:
    part = {
        "type": "tool-screenshot",
        "toolCallId": "call-1",
        "state": "output-available",
        "input": {},
        "output": output,
    }
    return {"id": message_id, "role": "assistant", "parts": [part]}


# ── SQLite views ────────────────────────────────────────────────────────────


def object_path(data_dir: Path, key: str) -> Path:
    from sessions_server.storage.paths import object_path as path_of

    return path_of(data_dir, key)


def meta_rows(data_dir: Path, key: str) -> dict[str, dict[str, Any]]:
    with open_readonly(object_path(data_dir, key)) as conn:
        rows = conn.execute("SELECT hash, bytes, media_type, chunks FROM cf_agents_session_attachment_meta").fetchall()
    return {row["hash"]: dict(row) for row in rows}


def chunk_sizes(data_dir: Path, key: str, digest: str) -> list[tuple[int, int]]:
    with open_readonly(object_path(data_dir, key)) as conn:
        rows = conn.execute(
            "SELECT idx, length(data) AS n FROM cf_agents_session_attachment_chunks WHERE hash = ? ORDER BY idx",
            (digest,),
        ).fetchall()
    return [(row["idx"], row["n"]) for row in rows]


def chunk_bytes(data_dir: Path, key: str, digest: str) -> bytes:
    with open_readonly(object_path(data_dir, key)) as conn:
        rows = conn.execute(
            "SELECT data FROM cf_agents_session_attachment_chunks WHERE hash = ? ORDER BY idx", (digest,)
        ).fetchall()
    return b"".join(bytes(row["data"]) for row in rows)


def all_chunk_rows(data_dir: Path, key: str) -> int:
    with open_readonly(object_path(data_dir, key)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM cf_agents_session_attachment_chunks").fetchone()[0])


def refs(data_dir: Path, key: str) -> set[tuple[str, str, str]]:
    with open_readonly(object_path(data_dir, key)) as conn:
        rows = conn.execute("SELECT session_id, message_id, hash FROM cf_agents_session_attachment_refs").fetchall()
    return {(row["session_id"], row["message_id"], row["hash"]) for row in rows}


def stored(data_dir: Path, key: str, message_id: str, session_id: str = "") -> str:
    return stored_json(data_dir, key, message_id, session_id)


def assert_no_payloads(data_dir: Path, key: str) -> None:
    assert meta_rows(data_dir, key) == {}
    assert all_chunk_rows(data_dir, key) == 0
    assert refs(data_dir, key) == set()


# ── what is media ───────────────────────────────────────────────────────────


def test_data_url_image_is_extracted_into_pointer_meta_chunk_and_ref(session: Any, object_key: str, data_dir: Path):
    data = payload(3000)
    message = image_message("m1", file_part(data))
    session.append_message(message)

    row = message_row(data_dir, object_key, "m1")
    assert row is not None
    expected = image_message("m1", {"type": "file", "mediaType": "image/png", "url": pointer(data)})
    assert row["content"] == js_json(expected)
    assert row["content_chunks"] == 0
    assert len(row["content"].encode()) < 1024
    assert meta_rows(data_dir, object_key) == {
        sha(data): {"hash": sha(data), "bytes": 3000, "media_type": "image/png", "chunks": 1}
    }
    assert chunk_sizes(data_dir, object_key, sha(data)) == [(0, 3000)]
    assert chunk_bytes(data_dir, object_key, sha(data)) == data
    assert refs(data_dir, object_key) == {("", "m1", sha(data))}

    assert session.get_message("m1") == message
    assert session.get_history() == [message]


def test_data_field_with_declared_non_text_media_type_is_extracted_and_restored_bare(
    session: Any, object_key: str, data_dir: Path
):
    data = payload(2000, 2)
    output = {"type": "content", "value": [{"type": "media", "mediaType": "image/jpeg", "data": b64(data)}]}
    message = tool_message("t1", output)
    session.append_message(message)

    stored_message = tool_message(
        "t1", {"type": "content", "value": [{"type": "media", "mediaType": "image/jpeg", "data": pointer(data)}]}
    )
    assert stored(data_dir, object_key, "t1") == js_json(stored_message)
    assert meta_rows(data_dir, object_key)[sha(data)]["media_type"] == "image/jpeg"
    restored = session.get_message("t1")
    assert restored == message  # `data` comes back as bare base64, not a data URL
    assert js_json(restored) == js_json(message)


def test_file_part_with_data_field_is_extracted(session: Any, object_key: str, data_dir: Path):
    data = payload(800, 9)
    part = {"type": "file", "mediaType": "application/pdf", "data": b64(data)}
    session.append_message(image_message("m", part))
    assert js_json({"type": "file", "mediaType": "application/pdf", "data": pointer(data)}) in stored(
        data_dir, object_key, "m"
    )
    assert session.get_message("m") == image_message("m", part)


@pytest.mark.parametrize(
    "part",
    [
        pytest.param(file_part(payload(300, 8), "text/plain"), id="text-data-url"),
        pytest.param(
            {"type": "file", "mediaType": "text/plain", "url": f"data:image/png;base64,{b64(payload(300, 8))}"},
            id="declared-text-beats-image-header",
        ),
        pytest.param(
            {"type": "file", "url": f"data:text/csv;base64,{b64(b'a,b')}"}, id="text-header-without-media-type"
        ),
        pytest.param({"type": "file", "mediaType": "text/csv", "data": b64(b"a,b\n")}, id="text-data-field"),
        pytest.param({"type": "file", "data": b64(payload(100))}, id="data-without-media-type"),
        pytest.param({"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,-_-_"}, id="base64url"),
        pytest.param(
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QUJDR"}, id="length-mod-4-is-1"
        ),
        pytest.param(
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QU!D"}, id="invalid-character"
        ),
        pytest.param(
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QQ=A"}, id="padding-inside"
        ),
        pytest.param({"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QQ==="}, id="three-pads"),
        pytest.param(
            {"type": "file", "mediaType": "image/svg+xml", "url": "data:image/svg+xml,%3Csvg%2F%3E"}, id="not-base64"
        ),
        pytest.param({"type": "file", "mediaType": "image/png", "url": "data:image/png;base64"}, id="no-comma"),
        pytest.param(
            {"type": "file", "mediaType": "image/png", "url": "https://example.com/a.png", "data": b64(payload(90))},
            id="https-url-and-data",
        ),
        pytest.param({"type": "file", "mediaType": "image/png", "url": POINTER + "0" * 64}, id="pointer-url-unknown"),
    ],
)
def test_records_that_are_not_media_stay_inline(session: Any, object_key: str, data_dir: Path, part: dict[str, Any]):
    message = image_message("m", part)
    session.append_message(message)
    assert stored(data_dir, object_key, "m") == js_json(message)
    assert meta_rows(data_dir, object_key) == {}
    assert all_chunk_rows(data_dir, object_key) == 0
    assert session.get_message("m") == message


LONGEST_MEDIA_TYPE = 1024  # bytes: ReadAttachment sends the type beside the bytes


@pytest.mark.parametrize(
    "media_type",
    [
        pytest.param("image/" + "x" * (LONGEST_MEDIA_TYPE - 5), id="ascii-one-byte-past"),
        pytest.param("image/" + "é" * 510, id="utf8-bytes-past"),  # 516 characters, 1026 bytes
        pytest.param("image/" + "x" * 5_000_000, id="five-mb"),
        # No UTF-8 form, so no text SQLite holds: storing it failed every write (INTERNAL).
        pytest.param("image/p\ud800ng", id="lone-surrogate"),
        # A comma ends a data URL's header, a `#` starts its fragment, and URL readers drop
        # control characters: the data URL a read rebuilt said other bytes
        # (`data:image/png;base64,QUFB;base64,<payload>`).
        pytest.param("image/png;base64,QUFB", id="comma"),
        pytest.param("image/png#x", id="fragment"),  # the bytes went into the URL's fragment
        pytest.param("image/png\nx", id="newline"),
        pytest.param("image/png\x00x", id="nul"),
    ],
)
def test_media_declared_with_a_media_type_no_data_url_carries_stays_inline(
    session: Any, object_key: str, data_dir: Path, media_type: str
):
    for field in ("url", "data"):
        data = payload(3000)
        if field == "url":
            part = file_part(data, media_type)
        else:
            part = {"type": "file", "mediaType": media_type, "data": b64(data)}
        message = image_message(f"m-{field}", part)
        session.append_message(message)
        # JSON.stringify writes a lone surrogate as its escape.
        assert stored(data_dir, object_key, f"m-{field}") == js_json(message).replace("\ud800", "\\ud800")
        assert session.get_message(f"m-{field}") == message
    assert_no_payloads(data_dir, object_key)


def test_media_type_at_the_limit_is_extracted_and_read_back(obj: Any, session: Any, object_key: str, data_dir: Path):
    media_type = "image/" + "x" * (LONGEST_MEDIA_TYPE - 6)
    data = payload(3000)
    message = image_message("m", file_part(data, media_type))
    session.append_message(message)
    assert meta_rows(data_dir, object_key)[sha(data)]["media_type"] == media_type
    attachment = obj.read_attachment(sha(data))
    assert (attachment.media_type, attachment.data) == (media_type, data)
    assert session.get_message("m") == message


def test_text_data_url_larger_than_the_row_budget_chunks_instead_of_extracting(
    session: Any, object_key: str, data_dir: Path
):
    text = ("lorem ipsum " * 200_000).encode()  # 2.4 MB of text, 3.2 MB as base64
    part = {"type": "file", "mediaType": "text/plain", "url": f"data:text/plain;base64,{b64(text)}"}
    message = image_message("big", part)
    session.append_message(message)
    row = message_row(data_dir, object_key, "big")
    assert row is not None and row["content_chunks"] >= 2
    assert stored(data_dir, object_key, "big") == js_json(message)
    assert meta_rows(data_dir, object_key) == {}
    assert session.get_message("big") == message


def _wrapped(record: dict[str, Any], containers: int) -> dict[str, Any]:
    """A tool message whose media record is enclosed by `containers` containers (the parts array,
    the part, then dict wrappers, the outermost being the tool output): its walk depth, where
    the parts array is depth 0 and each part depth 1."""
    assert containers >= 2
    value: Any = record
    for _ in range(containers - 2):
        value = {"wrap": value}
    return tool_message("t", value)


def test_depth_limit_media_inside_eight_containers_is_extracted(session: Any, object_key: str, data_dir: Path):
    data = payload(500, 21)
    message = _wrapped({"type": "media", "mediaType": "image/png", "data": b64(data)}, 8)  # depth 8
    session.append_message(message)
    assert pointer(data) in stored(data_dir, object_key, "t")
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert session.get_message("t") == message


@pytest.mark.parametrize("containers", [9, 12])
def test_depth_limit_media_inside_nine_or_more_containers_stays_inline(
    session: Any, object_key: str, data_dir: Path, containers: int
):
    data = payload(500, 22)
    message = _wrapped({"type": "media", "mediaType": "image/png", "data": b64(data)}, containers)
    session.append_message(message)
    assert stored(data_dir, object_key, "t") == js_json(message)
    assert meta_rows(data_dir, object_key) == {}
    assert session.get_message("t") == message


def test_media_record_children_are_not_walked(session: Any, object_key: str, data_dir: Path):
    outer, inner = payload(400, 31), payload(400, 32)
    part = {**file_part(outer), "thumbnail": file_part(inner)}
    session.append_message(image_message("m", part))
    assert set(meta_rows(data_dir, object_key)) == {sha(outer)}
    assert b64(inner) in stored(data_dir, object_key, "m")


def test_empty_payload_is_extracted_with_zero_chunks(session: Any, object_key: str, data_dir: Path):
    part = {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,"}
    session.append_message(image_message("e", part))
    assert js_json({"type": "file", "mediaType": "image/png", "url": POINTER + EMPTY_SHA256}) in stored(
        data_dir, object_key, "e"
    )
    assert meta_rows(data_dir, object_key) == {
        EMPTY_SHA256: {"hash": EMPTY_SHA256, "bytes": 0, "media_type": "image/png", "chunks": 0}
    }
    assert chunk_sizes(data_dir, object_key, EMPTY_SHA256) == []
    assert session.get_message("e") == image_message("e", part)


@pytest.mark.parametrize(
    ("header", "declared", "media_type"),
    [
        ("image/png;name=a.png", None, "image/png;name=a.png"),
        ("", None, "application/octet-stream"),
        ("image/png", "image/webp", "image/webp"),
    ],
)
def test_media_type_resolution(
    session: Any, object_key: str, data_dir: Path, header: str, declared: str | None, media_type: str
):
    data = payload(300, 41)
    part: dict[str, Any] = {"type": "file", "url": f"data:{header};base64,{b64(data)}"}
    if declared is not None:
        part = {"type": "file", "mediaType": declared, "url": part["url"]}
    session.append_message(image_message("m", part))
    assert meta_rows(data_dir, object_key)[sha(data)]["media_type"] == media_type


# ── stored form and payload rows ────────────────────────────────────────────


def test_part_without_media_type_gains_one_at_the_end(session: Any, object_key: str, data_dir: Path):
    data = payload(600, 51)
    part = {"type": "file", "url": f"data:image/gif;base64,{b64(data)}", "filename": "a.gif"}
    session.append_message(image_message("m", part))
    stored_part = {"type": "file", "url": pointer(data), "filename": "a.gif", "mediaType": "image/gif"}
    assert stored(data_dir, object_key, "m") == js_json(image_message("m", stored_part))
    read_part = {**part, "mediaType": "image/gif"}
    read = session.get_message("m")
    assert js_json(read) == js_json(image_message("m", read_part))  # not identical to the input


def test_whitespace_and_unpadded_base64_are_canonicalized_on_read(session: Any, object_key: str, data_dir: Path):
    spaced = {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QUJD\nREVG IA=="}
    unpadded = {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QUJDRA"}
    session.append_message(image_message("m", spaced, unpadded))
    assert set(meta_rows(data_dir, object_key)) == {sha(b"ABCDEF "), sha(b"ABCD")}
    read = session.get_message("m")
    assert read["parts"][1]["url"] == "data:image/png;base64,QUJDREVGIA=="
    assert read["parts"][2]["url"] == "data:image/png;base64,QUJDRA=="


def test_payload_of_one_and_a_half_mib_plus_500_kb_has_two_chunks(session: Any, object_key: str, data_dir: Path):
    data = payload(CHUNK_BYTES + 500_000, 61)
    message = image_message("big", file_part(data))
    session.append_message(message)
    assert meta_rows(data_dir, object_key)[sha(data)] == {
        "hash": sha(data),
        "bytes": len(data),
        "media_type": "image/png",
        "chunks": 2,
    }
    assert chunk_sizes(data_dir, object_key, sha(data)) == [(0, CHUNK_BYTES), (1, 500_000)]
    assert chunk_bytes(data_dir, object_key, sha(data)) == data
    assert session.get_message("big") == message


def test_two_mb_image_leaves_the_row_small_with_no_continuations(session: Any, object_key: str, data_dir: Path):
    data = payload(2_000_000, 62)
    message = image_message("img", file_part(data, "image/jpeg"))
    session.append_message(message)
    row = message_row(data_dir, object_key, "img")
    assert row is not None
    assert row["content_chunks"] == 0
    assert len(row["content"].encode()) < 1024
    assert session.object.get_object_stats().continuation_rows == 0
    assert session.get_message("img") == message


def test_same_payload_twice_stores_one_record_and_two_refs(session: Any, object_key: str, data_dir: Path):
    data = payload(5000, 71)
    session.append_message(image_message("a", file_part(data)))
    session.append_message(image_message("b", file_part(data), file_part(data)))  # one ref per distinct hash
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert chunk_sizes(data_dir, object_key, sha(data)) == [(0, 5000)]
    assert refs(data_dir, object_key) == {("", "a", sha(data)), ("", "b", sha(data))}
    stats = session.object.get_object_stats()
    assert (stats.attachment_count, stats.attachment_bytes) == (1, 5000)


def test_media_type_is_first_writer_wins(session: Any, object_key: str, data_dir: Path):
    data = payload(700, 72)
    first = image_message("a", file_part(data, "image/png"))
    second = image_message("b", file_part(data, "image/webp"))
    session.append_message(first)
    session.append_message(second)
    assert meta_rows(data_dir, object_key)[sha(data)]["media_type"] == "image/png"
    # The part keeps its declared type; the data URL header is the first-stored type.
    assert session.get_message("b")["parts"][1] == {
        "type": "file",
        "mediaType": "image/webp",
        "url": f"data:image/png;base64,{b64(data)}",
    }
    assert session.get_message("a") == first


def test_read_restores_the_common_case_byte_for_byte(session: Any):
    data = payload(10_000, 73)
    message = {
        "id": "m",
        "role": "user",
        "parts": [
            {"type": "text", "text": "two images"},
            file_part(data),
            {
                "type": "file",
                "mediaType": "application/pdf",
                "filename": "x.pdf",
                "url": file_part(data[:99], "application/pdf")["url"],
            },
        ],
        "metadata": {"k": 1},
    }
    written = session.append_message(message)
    assert written.message == message
    for read in (session.get_message("m"), session.get_history()[0], session.get_latest_leaf()):
        assert js_json(read) == js_json(message)


def test_import_extracts_attachments(session: Any, object_key: str, data_dir: Path):
    data = payload(900, 74)
    message = image_message("imp", file_part(data))
    assert session.import_message(message, parent_id=None, created_at=1_700_000_000_000)
    assert pointer(data) in stored(data_dir, object_key, "imp")
    assert refs(data_dir, object_key) == {("", "imp", sha(data))}
    assert session.get_message("imp") == message


# ── references ──────────────────────────────────────────────────────────────


def test_message_written_back_in_pointer_form_keeps_a_ref_and_copy_survives_original(
    session: Any, object_key: str, data_dir: Path
):
    data = payload(2000, 81)
    original = image_message("a", file_part(data))
    session.append_message(original)
    pointer_form = session.get_message("a", pointers=True)
    assert pointer_form["parts"][1]["url"] == pointer(data)

    copy = {**pointer_form, "id": "b"}
    session.append_message(copy)
    assert stored(data_dir, object_key, "b") == js_json(copy)
    assert refs(data_dir, object_key) == {("", "a", sha(data)), ("", "b", sha(data))}

    session.delete_messages(["a"])
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert session.get_message("b") == {**original, "id": "b"}

    session.delete_messages(["b"])
    assert_no_payloads(data_dir, object_key)


def test_pointer_nested_three_levels_deep_holds_a_ref(session: Any, object_key: str, data_dir: Path):
    data = payload(1500, 82)
    session.append_message(image_message("a", file_part(data)))
    nested = tool_message("c", {"a": {"b": {"type": "media", "mediaType": "image/png", "data": pointer(data)}}})
    session.append_message(nested)
    assert ("", "c", sha(data)) in refs(data_dir, object_key)

    session.delete_messages(["a"])
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert session.get_message("c")["parts"][0]["output"]["a"]["b"]["data"] == b64(data)


def test_unknown_pointer_is_left_as_it_is_on_read(session: Any):
    part = {"type": "file", "mediaType": "image/png", "url": pointer(b"never stored")}
    session.append_message(image_message("m", part))
    assert session.get_message("m") == image_message("m", part)


# ── lifetime ────────────────────────────────────────────────────────────────


def test_deleting_the_last_referrer_collects_the_payload(session: Any, object_key: str, data_dir: Path):
    data = payload(CHUNK_BYTES + 10, 91)
    session.append_message(image_message("a", file_part(data)))
    session.append_message(image_message("b", file_part(data)))
    session.delete_messages(["a"])
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert chunk_sizes(data_dir, object_key, sha(data)) == [(0, CHUNK_BYTES), (1, 10)]
    session.delete_messages(["b"])
    assert_no_payloads(data_dir, object_key)
    assert session.object.get_object_stats().attachment_count == 0


def test_update_that_drops_an_image_collects_it(session: Any, object_key: str, data_dir: Path):
    one, two = payload(4000, 92), payload(4000, 93)
    session.append_message(image_message("a", file_part(one)))
    session.update_message(image_message("a", file_part(two)))
    assert set(meta_rows(data_dir, object_key)) == {sha(two)}
    assert refs(data_dir, object_key) == {("", "a", sha(two))}
    session.update_message(text_message("a", "no image any more"))
    assert_no_payloads(data_dir, object_key)


def test_identical_re_sent_image_is_a_no_op_update(session: Any, object_key: str, data_dir: Path):
    data = payload(4000, 94)
    message = image_message("a", file_part(data))
    session.append_message(message)
    before = (message_row(data_dir, object_key, "a"), meta_rows(data_dir, object_key), refs(data_dir, object_key))
    writes = session.object.get_object_stats().row_writes

    result = session.upsert_message(message)
    assert (result.inserted, result.changed) == (False, False)
    assert session.update_message(message) == message
    assert session.object.get_object_stats().row_writes == writes
    after = (message_row(data_dir, object_key, "a"), meta_rows(data_dir, object_key), refs(data_dir, object_key))
    assert after == before


def test_clear_collects_every_payload_of_the_session(session: Any, object_key: str, data_dir: Path):
    session.append_message(image_message("a", file_part(payload(3000, 95))))
    session.append_message(image_message("b", file_part(payload(3000, 96)), file_part(payload(10, 97))))
    assert len(meta_rows(data_dir, object_key)) == 3
    session.clear_messages()
    assert_no_payloads(data_dir, object_key)


def test_payloads_are_shared_across_sessions_of_one_object(obj: Any, object_key: str, data_dir: Path):
    data = payload(3000, 98)
    first, second = obj.session("first"), obj.session("second")
    message = image_message("m", file_part(data))
    first.append_message(message)
    second.append_message(message)
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert refs(data_dir, object_key) == {("first", "m", sha(data)), ("second", "m", sha(data))}

    first.delete_messages(["m"])
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert second.get_message("m") == message

    first.append_message(message)
    first.clear_messages()  # clear releases only its own session's refs
    assert second.get_message("m") == message

    second.delete_messages(["m"])
    assert_no_payloads(data_dir, object_key)


def test_duplicate_id_import_leaves_no_orphan_payload(session: Any, object_key: str, data_dir: Path):
    """Deliberate difference (DESIGN.md §9): upstream stores the payload before its INSERT OR
    IGNORE and leaves it orphaned."""
    session.import_message(text_message("m1", "first"), parent_id=None, created_at=1_700_000_000_000)
    result = session.import_messages(
        [ImportItem(image_message("m1", file_part(payload(2500, 99))), None, 1_700_000_000_001)]
    )
    assert (result.imported, result.skipped) == (0, 1)
    assert_no_payloads(data_dir, object_key)
    assert session.object.get_object_stats().attachment_count == 0
    assert session.get_message("m1") == text_message("m1", "first")


def test_duplicate_id_append_stores_no_payload(session: Any, object_key: str, data_dir: Path):
    session.append_message(text_message("m1", "first"))
    result = session.append_message(image_message("m1", file_part(payload(2500, 100))))
    assert not result.inserted
    assert_no_payloads(data_dir, object_key)


def test_update_of_a_missing_id_stores_no_payload(session: Any, object_key: str, data_dir: Path):
    session.append_message(text_message("m1", "first"))
    assert session.update_message(image_message("absent", file_part(payload(2500, 101)))) is None
    assert_no_payloads(data_dir, object_key)


def test_a_repeated_append_answers_and_announces_the_media_not_the_pointer(
    stub: Any, object_key: str, session: Any
) -> None:
    """A retry of an append meets the stored row: the answer, and the change event, carry the
    message as a read gives it, payloads put back (upstream reads the row back the same way)."""
    sent = image_message("m1", file_part(payload(2500, 102)))
    text = js_json(sent)
    feed = stub.Subscribe(pb.SubscribeRequest(object_key=object_key))
    assert next(feed).type == pb.CHANGE_TYPE_PROGRESS
    first = stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=text))
    again = stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=text))
    in_batch = stub.AppendMessages(
        pb.AppendMessagesRequest(
            object_key=object_key, items=[pb.AppendItem(message_json=text), pb.AppendItem(message_json=text)]
        )
    )

    assert first.inserted and not again.inserted
    assert again.message.json == text
    assert [(r.inserted, r.message.json) for r in in_batch.results] == [(False, text), (False, text)]
    events = [next(feed) for _ in range(4)]
    feed.cancel()
    assert [(e.type, e.inserted, e.message.json) for e in events] == [
        (pb.CHANGE_TYPE_APPEND, True, text),
        (pb.CHANGE_TYPE_APPEND, False, text),
        (pb.CHANGE_TYPE_APPEND, False, text),
        (pb.CHANGE_TYPE_APPEND, False, text),
    ]
    assert session.append_message(sent).message == sent  # the client, which omits what it sent
