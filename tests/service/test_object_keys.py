"""Object keys: validated, hashed into file names, never used as paths; the x-object-key routing
header must agree with the request body (DESIGN.md §2, §4, §8)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_client import SessionsClient, SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.datadir import LOCK_FILE_NAME
from sessions_server.storage.paths import OBJECTS_DIR
from tests.conftest import start_server
from tests.service.support import (
    error_reason,
    files_under,
    message_rows,
    object_file,
    open_readonly,
    text_message,
)


@pytest.mark.parametrize(
    "key",
    ["", "a\x00b", "\x00", "line\nbreak", "tab\there", "bell\x07", "del\x7f", "c1\x85control", "k" * 2000],
    ids=["empty", "nul", "only-nul", "newline", "tab", "bell", "del", "c1", "2000-bytes"],
)
def test_invalid_object_key_is_refused(client: Any, key: str) -> None:
    session = client.object(key).session()
    with pytest.raises(SessionsError) as caught:
        session.append_message(text_message("a"))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "INVALID_OBJECT_KEY"


def test_too_long_names_say_which_limit_as_other_limits_do(client: Any) -> None:
    """A key or session id past its length names its limit as every other limit does (limit,
    limit_value), beside the limit_bytes it named before."""
    cases = [
        (client.object("k" * 1025).session(), "INVALID_OBJECT_KEY", "object_key", "max_object_key_bytes"),
        (client.object("k").session("s" * 1025), "INVALID_FIELD", "session_id", "max_session_id_bytes"),
    ]
    for session, reason, field, limit in cases:
        with pytest.raises(SessionsError) as caught:
            session.append_message(text_message("a"))
        assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
        assert caught.value.metadata == {"field": field, "limit": limit, "limit_value": "1024", "limit_bytes": "1024"}


def test_invalid_object_key_is_refused_on_reads(client: Any) -> None:
    session = client.object("bad\x00key").session()
    for read in (session.get_history, session.get_latest_leaf, session.get_history_row_stats):
        with pytest.raises(SessionsError) as caught:
            read()
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.reason == "INVALID_OBJECT_KEY"


def test_too_long_key_creates_no_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client:
            for key in ("k" * 2000, "nul\x00"):
                with pytest.raises(SessionsError) as refused:
                    client.object(key).session().append_message(text_message("a"))
                assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.reason == "INVALID_OBJECT_KEY"
    finally:
        server.stop()
    assert files_under(data_dir) == [data_dir / LOCK_FILE_NAME]  # the server's own, no object's
    # The objects' directory exists from the start: Litestream, watching it, exits if it does not.
    assert (data_dir / OBJECTS_DIR).is_dir()


def test_a_key_too_long_is_refused_by_the_server_however_long_its_header(client: Any) -> None:
    """Clients send the key in `x-object-key` too, percent-encoded: 9,000 slashes make a
    27,000-byte header, past gRPC core's default bounds (8 KiB, beyond which it refuses some
    calls at random, and 16 KiB), which answered RESOURCE_EXHAUSTED with no reason instead."""
    # Past this server's own room too (4 x 1 KiB + 32 KiB): 4,200 CJK characters go as a
    # 37,800-byte header, 100,000 bytes as one of that length, which gRPC refused in each
    # client's words (RESOURCE_EXHAUSTED, INTERNAL, TypeScript's REFUSED_STREAM retried).
    for key in ("/" * 9_000, "é" * 4_500, "k" * 20_000, "中" * 4_200, "k" * 100_000, "😀" * 16_384, "k" * 300_000):
        for _ in range(5):
            with pytest.raises(SessionsError) as caught:
                client.object(key).session().append_message(text_message("a"))
            assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_OBJECT_KEY")


def test_a_key_longer_than_any_server_takes_is_refused_before_it_is_sent(client: Any) -> None:
    """Its header would pass the room every server makes (for keys up to the largest
    --max-object-key-bytes, 64 KiB): gRPC refused it RESOURCE_EXHAUSTED, "received metadata size
    exceeds hard limit"; the client says what the server would, as the Go and TypeScript ones do."""
    with pytest.raises(SessionsError) as caught:
        client.object("k" * 300_000).session().append_message(text_message("a"))
    assert (caught.value.code, caught.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_OBJECT_KEY")
    assert caught.value.message == (
        "object_key is 300000 bytes; no server takes more than 65536 bytes (its --max-object-key-bytes at most)"
    )


def test_a_key_within_a_raised_limit_is_taken_whatever_its_header_size(tmp_path: Path) -> None:
    """With --max-object-key-bytes 8192, a key of 8,000 bytes of "é" goes as a 24,000-byte
    header: gRPC core refused every such call before a handler saw it."""
    server = start_server(tmp_path / "data", max_object_key_bytes=8192)
    key = "é" * 4_000
    try:
        with SessionsClient(server.address) as client:
            session = client.object(key).session()
            for index in range(5):
                assert session.append_message(text_message(f"m{index}")).inserted
            assert [message["id"] for message in session.get_history()] == [f"m{index}" for index in range(5)]
    finally:
        server.stop()


HOSTILE_KEYS = [
    "../x",
    "../../../../../../tmp/evil",
    "/etc/passwd",
    "a/../../b",
    "..",
    ".",
    "C:\\Windows\\system32",
    "~root/.ssh/authorized_keys",
    "objects/00/00/x.sqlite",
    "ключ/😀/漢字",
    "%2e%2e%2fx",
    "k" * 1024,
]


def test_hostile_keys_are_ordinary_keys_inside_the_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client:
            for index, key in enumerate(HOSTILE_KEYS):
                session = client.object(key).session()
                session.append_message(text_message(f"m{index}", key))
            # each key is its own object holding exactly its own message
            for index, key in enumerate(HOSTILE_KEYS):
                history = client.object(key).session().get_history()
                assert history == [text_message(f"m{index}", key)]
    finally:
        server.stop()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    objects = (data_dir / "objects").resolve()
    outside = [path for path in files_under(data_dir) if not path.resolve().is_relative_to(objects)]
    assert outside == [data_dir / LOCK_FILE_NAME]  # the server's own lock, no object's file
    expected = {object_file(data_dir, key) for key in HOSTILE_KEYS}
    databases = {p for p in files_under(data_dir) if p.suffix == ".sqlite"}
    assert databases == expected
    for key in HOSTILE_KEYS:
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        assert object_file(data_dir, key).name == f"{digest}.sqlite"
        if len(key) > 2:
            assert key not in str(object_file(data_dir, key).relative_to(data_dir))


def test_the_key_is_recorded_inside_its_file(client: Any, data_dir: Path) -> None:
    key = "recorded/../key ü"
    client.object(key).session().append_message(text_message("a"))
    found = False
    with open_readonly(object_file(data_dir, key)) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table.startswith("cf_agents_session_"):
                continue
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                found = found or key in tuple(row)
    assert found, "the object key is not stored inside the object's file"


def test_a_file_copied_to_another_keys_path_is_refused_and_left_alone(
    client: Any, stub: Any, data_dir: Path, object_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's copy of one object's file to another key's path (a backup restored to the
    wrong place) belongs to neither key: calls on the path's key are refused with what to do,
    the file stays as it is, the listing does not name its recorded key twice, and the server
    logs it once (at ERROR: only the operator can act), not once a call."""
    client.object(object_key).session().append_message(text_message("m1"))
    other = f"{object_key}-restored"
    copy = object_file(data_dir, other)
    copy.parent.mkdir(parents=True, exist_ok=True)
    with (
        open_readonly(object_file(data_dir, object_key)) as source,
        contextlib.closing(sqlite3.connect(copy)) as target,
    ):
        source.backup(target)
        target.execute("PRAGMA journal_mode = DELETE")  # a plain copy, as `sqlite3 .backup` makes
    before = copy.read_bytes()
    calls = {
        "GetMessage": lambda: list(stub.GetMessage(pb.GetMessageRequest(object_key=other, message_id="m1"))),
        "AppendMessage": lambda: stub.AppendMessage(append_request(other)),
        "StreamHistory": lambda: list(stub.StreamHistory(pb.StreamHistoryRequest(object_key=other))),
        "ExportObject": lambda: list(stub.ExportObject(pb.ExportObjectRequest(object_key=other))),
    }
    with caplog.at_level(logging.WARNING, logger="sessions.objects"):
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
            details = caught.value.details()
            assert str(copy.relative_to(data_dir)) in details and "erase" in details, name
            assert object_key not in details, name  # whose file it is: the caller may not be granted that key
    logged = [record for record in caplog.records if str(copy) in record.getMessage()]
    assert [record.levelno for record in logged] == [logging.ERROR], [record.getMessage() for record in logged]
    assert repr(object_key) in logged[0].getMessage()
    assert copy.read_bytes() == before
    listed = stub.ListObjects(pb.ListObjectsRequest(page_size=1000)).object_keys
    assert list(listed).count(object_key) == 1
    assert other not in listed

    assert stub.DeleteObject(pb.DeleteObjectRequest(object_key=other, erase=True)).deleted
    assert not copy.exists()
    client.object(other).session().append_message(text_message("fresh"))
    assert [m["id"] for m in client.object(other).session().get_history()] == ["fresh"]
    assert [m["id"] for m in client.object(object_key).session().get_history()] == ["m1"]


def test_keys_differing_only_in_case_or_unicode_form_are_distinct(client: Any, object_key: str) -> None:
    composed, decomposed = f"{object_key}-\u00e9", f"{object_key}-e\u0301"
    for key in (object_key, object_key.upper(), composed, decomposed):
        client.object(key).session().append_message(text_message(key))
    for key in (object_key, object_key.upper(), composed, decomposed):
        assert [m["id"] for m in client.object(key).session().get_history()] == [key]


# ── routing header ──────────────────────────────────────────────────────────


def append_request(object_key: str) -> pb.AppendMessageRequest:
    return pb.AppendMessageRequest(
        object_key=object_key, message_json='{"id":"a","role":"user","parts":[]}', parent_mode=pb.PARENT_MODE_AUTO
    )


def test_object_key_header_mismatch_is_refused(stub: Any, data_dir: Path, object_key: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.AppendMessage(append_request(object_key), metadata=(("x-object-key", "other"),))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_reason(caught.value) == "OBJECT_KEY_MISMATCH"
    assert message_rows(data_dir, object_key) == []
    assert message_rows(data_dir, "other") == []


@pytest.mark.parametrize("shard", ["ring-file", "flag"])
def test_a_shard_refuses_calls_without_the_routing_header(tmp_path: Path, shard: str) -> None:
    """A proxy hashes x-object-key: a call without it goes to any shard, which created a second
    copy of the object there (HAProxy spread 12 appends over 3 shards). A shard (`--ring-file`, or
    `--require-routing-header` behind a proxy whose ring it cannot check) refuses it unwritten."""
    ring = tmp_path / "ring.json"
    ring.write_text('{"scheme": "nginx-ketama", "shards": ["me:1"], "self": "me:1"}')
    options: dict[str, Any] = {"ring_file": ring} if shard == "ring-file" else {"require_routing_header": True}
    server = start_server(tmp_path / "data", **options)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.AppendMessage(append_request("k"))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert error_reason(caught.value) == "OBJECT_KEY_MISMATCH"
            assert "x-object-key metadata is missing" in caught.value.details()  # type: ignore[attr-defined]
            assert not files_under(tmp_path / "data" / "objects")
            stub.AppendMessage(append_request("k"), metadata=(("x-object-key", "k"),))
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING  # not an object call
        with SessionsClient(server.address) as client:  # the clients send it
            assert [m["id"] for m in client.object("k").session().get_history()] == ["a"]
    finally:
        server.stop()


def test_a_shard_takes_the_routing_header_only_as_the_clients_spell_it(tmp_path: Path) -> None:
    """HAProxy hashes the header's text: `a/b`, `a%2fb` and `a%2Fb` all named the key `a/b` and
    reached three shards, three copies of one object each taking writes. A shard takes the
    spelling the clients send (urllib.parse.quote with no safe characters) and refuses others,
    naming it; a server that is no shard takes any."""
    server = start_server(tmp_path / "data", require_routing_header=True)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            for key, spelling in (
                ("a/b", "a/b"),
                ("a/b", "a%2fb"),
                ("x y", "x y"),
                ("Ключ", "%d0%9a%d0%bb%d1%8e%d1%87"),
            ):
                with pytest.raises(grpc.RpcError) as caught:
                    stub.AppendMessage(append_request(key), metadata=(("x-object-key", spelling),))
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
                assert error_reason(caught.value) == "OBJECT_KEY_MISMATCH"
                canonical = urllib.parse.quote(key, safe="")
                assert f"spell the key as the clients do, {canonical!r}" in caught.value.details()  # type: ignore[attr-defined]
            assert not files_under(tmp_path / "data" / "objects")
            stub.AppendMessage(append_request("a/b"), metadata=(("x-object-key", "a%2Fb"),))
        with SessionsClient(server.address) as client:
            assert [m["id"] for m in client.object("a/b").session().get_history()] == ["a"]
            assert client.object("x y~._-").session().append_message(text_message("b")).inserted
    finally:
        server.stop()


def test_a_server_that_is_no_shard_takes_any_spelling_of_the_key(stub: Any, data_dir: Path) -> None:
    stub.AppendMessage(append_request("c/d"), metadata=(("x-object-key", "c/d"),))
    stub.AppendMessage(append_request("c/d"), metadata=(("x-object-key", "c%2fd"),))
    assert len(message_rows(data_dir, "c/d")) == 1


@pytest.mark.parametrize("character", ["k", "字", "😀"])
def test_an_error_quoting_a_long_key_still_arrives(stub: Any, character: str) -> None:
    """The mismatch quotes both keys, and a status travels in trailers, which clients drop past
    8-16 KiB: a 10,000-character key got "metadata size exceeds hard limit" and no reason. The
    message is cut to 1 KiB of UTF-8 instead."""
    with pytest.raises(grpc.RpcError) as caught:
        stub.AppendMessage(append_request(character * 10_000), metadata=(("x-object-key", "other"),))

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_reason(caught.value) == "OBJECT_KEY_MISMATCH"
    details = caught.value.details()  # type: ignore[attr-defined]
    assert details.startswith("x-object-key metadata ('other') differs from object_key")
    assert len(details.encode()) <= 1024 + 40 and details.endswith("more bytes)")


def test_object_key_header_mismatch_is_refused_on_streaming_reads(stub: Any, object_key: str) -> None:
    request = pb.StreamHistoryRequest(object_key=object_key)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.StreamHistory(request, metadata=(("x-object-key", "other"),)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_reason(caught.value) == "OBJECT_KEY_MISMATCH"


def test_percent_encoded_header_matches(stub: Any, data_dir: Path) -> None:
    key = "héllo wörld/😀?&="
    header = urllib.parse.quote(key, safe="")
    response = stub.AppendMessage(append_request(key), metadata=(("x-object-key", header),))
    assert response.inserted is True
    assert [r["id"] for r in message_rows(data_dir, key)] == ["a"]


def test_header_is_optional(stub: Any, data_dir: Path, object_key: str) -> None:
    response = stub.AppendMessage(append_request(object_key))
    assert response.inserted is True
    assert response.message.info.seq == 1
    assert [r["id"] for r in message_rows(data_dir, object_key)] == ["a"]


def test_object_file_is_a_plain_sqlite_database(client: Any, data_dir: Path, object_key: str) -> None:
    client.object(object_key).session().append_message(text_message("a"))
    path = object_file(data_dir, object_key)
    assert path.read_bytes()[:16] == b"SQLite format 3\x00"
    with open_readonly(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_object_key_header_mismatch_is_refused_on_client_streams(stub: Any, data_dir: Path, object_key: str) -> None:
    header = pb.UploadHeader(object_key=object_key, operation=pb.UPLOAD_OPERATION_APPEND)
    upload = [pb.UploadMessageRequest(header=header, json_piece='{"id":"a","role":"user","parts":[]}')]
    with pytest.raises(grpc.RpcError) as caught:
        stub.UploadMessage(iter(upload), metadata=(("x-object-key", "other"),))
    assert error_reason(caught.value) == "OBJECT_KEY_MISMATCH"

    frames = [pb.ImportMessagesRequest(object_key=object_key, json_piece='{"id":"a","role":"user","parts":[]}')]
    with pytest.raises(grpc.RpcError) as caught:
        stub.ImportMessages(iter(frames), metadata=(("x-object-key", "other"),))
    assert error_reason(caught.value) == "OBJECT_KEY_MISMATCH"
    assert message_rows(data_dir, object_key) == []
