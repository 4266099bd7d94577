"""Helpers shared by the service and storage tests: where an object's file is, read-only looks at
its rows, message builders, and the JS `JSON.stringify` bytes a Python dict serializes to.

The file layout (`<data_dir>/objects/ab/cd/<sha256(key)>.sqlite`) is computed here on purpose
rather than imported from the server, so the tests pin it down independently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb

ROW_BUDGET_BYTES = 1_572_864  # 1536 * 1024: upstream's MAX_INLINE_ROW_BYTES
FRAME_LIMIT_BYTES = 4 * 1024 * 1024  # default gRPC receive limit: no response frame may exceed it


def object_file(data_dir: Path, object_key: str) -> Path:
    digest = hashlib.sha256(object_key.encode("utf-8")).hexdigest()
    return data_dir / "objects" / digest[0:2] / digest[2:4] / f"{digest}.sqlite"


@contextlib.contextmanager
def open_readonly(path: Path) -> Iterator[sqlite3.Connection]:
    """A separate, read-only connection to an object file (the server keeps its own open)."""
    assert path.exists(), f"object file {path} does not exist"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def message_rows(data_dir: Path, object_key: str, session_id: str | None = "") -> list[dict[str, Any]]:
    """Every message row of a session (all sessions when session_id is None), seq order."""
    path = object_file(data_dir, object_key)
    if not path.exists():
        return []
    with open_readonly(path) as conn:
        if session_id is None:
            rows = conn.execute("SELECT * FROM cf_agents_session_messages ORDER BY session_id, seq").fetchall()
        else:
            rows = conn.execute(
                "SELECT * FROM cf_agents_session_messages WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
    return [dict(row) for row in rows]


def message_row(data_dir: Path, object_key: str, message_id: str, session_id: str = "") -> dict[str, Any] | None:
    for row in message_rows(data_dir, object_key, session_id):
        if row["id"] == message_id:
            return row
    return None


def chunk_rows(data_dir: Path, object_key: str, session_id: str | None = "") -> list[dict[str, Any]]:
    """Continuation rows of a session (all sessions when session_id is None), by id then idx."""
    path = object_file(data_dir, object_key)
    if not path.exists():
        return []
    with open_readonly(path) as conn:
        if session_id is None:
            rows = conn.execute("SELECT * FROM cf_agents_session_message_chunks ORDER BY session_id, id, idx")
        else:
            rows = conn.execute(
                "SELECT * FROM cf_agents_session_message_chunks WHERE session_id = ? ORDER BY id, idx",
                (session_id,),
            )
        return [dict(row) for row in rows.fetchall()]


def stored_json(data_dir: Path, object_key: str, message_id: str, session_id: str = "") -> str:
    """The full stored JSON of a message: slice 0 plus its continuation rows in idx order."""
    row = message_row(data_dir, object_key, message_id, session_id)
    assert row is not None, f"no row for {message_id!r}"
    chunks = [c for c in chunk_rows(data_dir, object_key, session_id) if c["id"] == message_id]
    assert [c["idx"] for c in chunks] == list(range(1, row["content_chunks"] + 1))
    return str(row["content"]) + "".join(str(c["content"]) for c in chunks)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def js_json(message: Any) -> str:
    """`JSON.stringify` of a plain dict with string keys that are not integer-like, ints, str."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text_message(message_id: str, text: str = "hi", role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": text}], **extra}


def message_of_json_size(message_id: str, size_bytes: int, fill: str = "a") -> dict[str, Any]:
    """A text message whose JSON (as sent, which is the stored form) is exactly size_bytes long."""
    empty = utf8_len(js_json(text_message(message_id, "")))
    width = utf8_len(fill)
    assert (size_bytes - empty) % width == 0
    message = text_message(message_id, fill * ((size_bytes - empty) // width))
    assert utf8_len(js_json(message)) == size_bytes
    return message


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


def error_reason(error: grpc.RpcError) -> str | None:
    """The google.rpc.ErrorInfo reason of a failed raw-stub call."""
    from sessions_client import SessionsError

    return SessionsError.from_rpc_error(error).reason


def violated_field(error: grpc.RpcError) -> str:
    """The field of the error's one `google.rpc.BadRequest` field violation."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    (detail,) = [detail for detail in status.details if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR)]
    bad = error_details_pb2.BadRequest()
    detail.Unpack(bad)
    (violation,) = bad.field_violations
    return str(violation.field)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def listed_object_keys(stub: Any) -> set[str]:
    """Every object key ListObjects names, page after page."""
    from sessions_proto.v1 import sessions_pb2 as pb

    keys: set[str] = set()
    token = ""
    while True:
        page = stub.ListObjects(pb.ListObjectsRequest(page_size=1000, page_token=token))
        keys.update(page.object_keys)
        if not (token := page.next_page_token):
            return keys


def exported(stub: Any, object_key: str, *, lock_for_move: bool = False) -> list[Any]:
    """The frames of an ExportObject of `object_key` (its last one names a move lock, if taken)."""
    request = pb.ExportObjectRequest(object_key=object_key, lock_for_move=lock_for_move)
    return list(stub.ExportObject(request, metadata=routing_metadata(object_key)))


def stream_opens(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The methods of the streams `client` opens from now on, a subscription's reconnections
    included (sync or asyncio)."""
    opened: list[str] = []
    stream = client._stream

    def counting(object_key: str, method: str, request: Any, **options: Any) -> Any:
        opened.append(method)
        return stream(object_key, method, request, **options)

    monkeypatch.setattr(client, "_stream", counting)
    return opened
