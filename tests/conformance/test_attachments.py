"""Attachments: content-addressed media extracted from base64 data URLs (reference notes §4, §12
"Attachments"). Stored rows include attachment meta (hash, bytes, media type, chunks), chunk rows
(length and first bytes) and refs, on both sides."""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Callable
from typing import Any

import pytest

from tests.conformance.harness.messages import msg
from tests.conformance.harness.pair import Pair

T0 = 1_600_000_000_000


def payload(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_part(data: bytes, media_type: str | None = "image/png", header: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "file"}
    if media_type is not None:
        part["mediaType"] = media_type
    part["url"] = f"data:{header or media_type or 'image/png'};base64,{b64(data)}"
    return part


def image_msg(mid: str, *parts: dict[str, Any], text: str = "look") -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}, *parts]}


def pointer(data: bytes) -> str:
    return "attachment:sha256:" + hashlib.sha256(data).hexdigest()


def test_image_extracted_and_restored(pair: Pair) -> None:
    pair.append(image_msg("i1", image_part(payload(3000))))
    pair.append(msg("after"))


def test_same_payload_twice_one_record_two_refs(pair: Pair) -> None:
    data = payload(5000, 2)
    pair.append(image_msg("a", image_part(data)))
    pair.append(image_msg("b", image_part(data), image_part(data)))  # one ref per distinct hash
    pair.append(image_msg("c", image_part(data, "image/jpeg")), session="s1")  # first writer's type wins


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("no-media-type", image_part(payload(700, 3), media_type=None, header="image/gif")),
        ("declared-differs-from-header", image_part(payload(700, 4), "image/webp", header="image/png")),
        ("header-params", image_part(payload(700, 5), None, header="image/png;name=a.png")),
        ("octet-stream", image_part(payload(700, 6), "application/octet-stream")),
        ("pdf", image_part(payload(900, 7), "application/pdf")),
        ("empty-payload", {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,"}),
        (
            "whitespace-base64",
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QUJD\nREVG IA=="},
        ),
        ("unpadded-base64", {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QUJDRA"}),
        ("base64url-stays-inline", {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,-_-_"}),
        ("bad-length-stays-inline", {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,QUJDR"}),
        ("not-base64-data-url", {"type": "file", "mediaType": "image/png", "url": "data:image/png,rawbytes"}),
        ("text-type-stays-inline", image_part(payload(300, 8), "text/plain")),
        ("https-url", {"type": "file", "mediaType": "image/png", "url": "https://example.com/a.png"}),
        ("data-field", {"type": "file", "mediaType": "image/png", "data": b64(payload(800, 9))}),
        ("data-field-text-type", {"type": "file", "mediaType": "text/csv", "data": b64(b"a,b\n")}),
        (
            "data-field-with-https-url",
            {"type": "file", "mediaType": "image/png", "url": "https://x", "data": b64(b"xyz")},
        ),
    ],
)
def test_extraction_rules(pair: Pair, name: str, part: dict[str, Any]) -> None:
    pair.append(image_msg("m", part))
    pair.import_(image_msg("imp", part), parent="m", created_at=T0)


def test_nested_media_in_tool_output(pair: Pair) -> None:
    data = payload(1200, 10)
    nested: Any = {"type": "media", "mediaType": "image/png", "data": b64(data)}
    output = {"type": "content", "value": [{"type": "text", "text": "see"}, nested]}
    part = {"type": "tool-shot", "toolCallId": "c1", "state": "output-available", "input": {}, "output": output}
    pair.append({"id": "t1", "role": "assistant", "parts": [part]})
    deep: Any = {"type": "media", "mediaType": "image/png", "data": b64(payload(300, 11))}
    for _ in range(9):  # beyond the depth-8 walk: stays inline
        deep = {"wrap": deep}
    pair.append({"id": "t2", "role": "assistant", "parts": [{"type": "tool-x", "toolCallId": "c2", "output": deep}]})


def test_caller_supplied_pointers(pair: Pair) -> None:
    data = payload(2000, 12)
    pair.append(image_msg("a", image_part(data)))
    known = {"type": "file", "mediaType": "image/png", "url": pointer(data)}
    unknown = {"type": "file", "mediaType": "image/png", "url": pointer(b"never stored")}
    pair.append(image_msg("b", known, unknown))  # b takes its own ref to the known payload
    pair.delete(["a"])  # the payload survives: b still refers to it
    pair.delete(["b"])  # collected


def test_lifetime_update_delete_clear(pair: Pair) -> None:
    one, two = payload(4000, 13), payload(4000, 14)
    pair.append(image_msg("a", image_part(one)))
    pair.update(image_msg("a", image_part(one)))  # identical re-sent image: no-op
    pair.update(image_msg("a", image_part(two)))  # drops one (collected), adds two
    pair.append(image_msg("b", image_part(two)))
    pair.delete(["a"])
    pair.append(image_msg("c", image_part(one)))
    pair.clear()


def test_large_payload_chunks(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(level="light")
    data = payload(1_572_864 + 500_000, 15)
    pair.append(image_msg("big", image_part(data)))  # 2 attachment chunks, message row stays small
    pair.append(msg("after"))
    pair.delete(["big"])


def test_budgets_with_attachments(pair: Pair) -> None:
    for i in range(4):
        pair.append(image_msg(f"p{i}", image_part(payload(40_000, 20 + i))), check=i == 3)


def test_duplicate_import_leaves_no_orphan_payload(pair: Pair) -> None:
    """DESIGN §9 (deliberate): a duplicate-id import stores no orphan payload. Upstream stores the
    payload before its INSERT OR IGNORE, leaving a meta/chunk record with no ref."""
    pair.append(msg("a"))
    data = payload(1000, 30)
    body = {"message": image_msg("a", image_part(data)), "options": {"parentId": None, "createdAt": T0}}
    pair.up("importMessage", body)
    assert not pair.ours().import_message(image_msg("a", image_part(data)), parent_id=None, created_at=T0)
    digest = hashlib.sha256(data).hexdigest()
    assert [r["hash"] for r in pair.oracle.sql(pair.key, "SELECT hash FROM cf_agents_session_attachment_meta")] == [
        digest
    ]
    assert pair.our_rows_now().tables["attachment_meta"] == []
