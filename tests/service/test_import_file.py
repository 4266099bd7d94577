"""`sessions_client.admin.import_file`: a store file sent to a running server (ImportObject), in
frames with its digest, from a consistent copy (a live file's WAL included)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_client.admin import IMPORT_FRAME_BYTES, export_file, import_file
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.limits import Limits
from sessions_server.storage import schema
from sessions_server.storage.paths import object_path
from tests.conftest import start_server


def _message(message_id: str, size: int) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id * (size // 2)}]}


def test_a_live_file_larger_than_a_frame_arrives_whole(tmp_path: Path) -> None:
    origin = start_server(tmp_path / "origin")
    destination = start_server(tmp_path / "destination")
    try:
        with SessionsClient(origin.address) as client:
            session = client.object("source").session()
            messages = [_message(f"m{index}", 1_300_000) for index in range(6)]  # ≈8 MB: three frames
            for message in messages:
                session.append_message(message)
            live = object_path(tmp_path / "origin", "source")
            assert Path(f"{live}-wal").stat().st_size > 0  # a live file, its WAL beside it
            assert live.stat().st_size + Path(f"{live}-wal").stat().st_size > 2 * IMPORT_FRAME_BYTES

            with SessionsClient(destination.address) as target:
                report = import_file(target, "arrived", live)
                assert (report.object_key, report.message_rows) == ("arrived", 6)
                assert report.size_bytes > 2 * IMPORT_FRAME_BYTES
                assert target.object("arrived").session().get_history() == messages

                with pytest.raises(SessionsError) as exists:
                    import_file(target, "arrived", live)
                assert exists.value.code == grpc.StatusCode.FAILED_PRECONDITION
                assert exists.value.message == "the object already exists here (set replace)"
                assert exists.value.reason == "OBJECT_EXISTS"  # the CLI matched the message before

                session.append_message(_message("m6", 100))
                assert import_file(target, "arrived", live, replace=True).message_rows == 7
                assert [m["id"] for m in target.object("arrived").session().get_history()][-1] == "m6"
    finally:
        origin.stop()
        destination.stop()


def test_what_is_not_a_store_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            notes = tmp_path / "notes.txt"
            notes.write_text("not SQLite " * 1000)
            with pytest.raises(SessionsError) as refused:
                import_file(client, "k", notes)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.message.startswith(f"{notes} is not a usable SQLite store: ")
            with pytest.raises(FileNotFoundError):
                import_file(client, "k", tmp_path / "missing.sqlite")
        assert not object_path(tmp_path / "data", "k").exists()
    finally:
        server.stop()


def test_a_received_file_that_is_not_a_store_is_refused_without_naming_server_paths(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    data = b"not SQLite " * 1000
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            frames = [
                pb.ImportObjectRequest(object_key="k", data=data),
                pb.ImportObjectRequest(sha256=hashlib.sha256(data).hexdigest()),
            ]
            with pytest.raises(grpc.RpcError) as refused:
                stub.ImportObject(iter(frames), metadata=routing_metadata("k"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        message = refused.value.details() or ""
        assert message.startswith("the received file cannot be served: it is not a usable SQLite store"), message
        assert str(data_dir) not in message and "scratch" not in message
    finally:
        server.stop()


def test_frames_are_written_read_and_hashed_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An import writes each received frame, and an export reads each frame it sends, with its
    hashing, on a worker thread: on the event loop a write the disk held up stalled every call
    (an import of 2.5 GB: up to 4.5 s). Each frame is held here until a call to another object
    has been answered, which it could not be if the frame held the event loop."""
    from sessions_server.domain.objects import ObjectAdmin

    held, release = threading.Event(), threading.Event()
    original_write, original_read = ObjectAdmin._write_received, ObjectAdmin._read_to_send

    def hold() -> None:
        held.set()
        assert release.wait(timeout=60), "the frame was never released"

    def write_held(admin: Any, out: Any, digest: Any, data: bytes) -> None:
        hold()
        original_write(admin, out, digest, data)

    def read_held(stream: Any, digest: Any) -> bytes:
        hold()
        return original_read(stream, digest)

    server = start_server(tmp_path / "data")
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.SessionServiceStub(channel)
    try:
        with SessionsClient(server.address) as client:
            client.object("other").session().append_message(_message("o1", 10))
            client.object("source").session().append_message(_message("m1", 1000))
            exported: list[bytes] = []
            imported: list[object] = []

            def export() -> None:
                request = pb.ExportObjectRequest(object_key="source")
                frames = stub.ExportObject(request, metadata=routing_metadata("source"), timeout=60)
                exported.append(b"".join(frame.data for frame in frames))

            def import_() -> None:
                imported.append(import_file(client, "copy", object_path(tmp_path / "data", "source")))

            replacements: tuple[tuple[str, object, Callable[[], None]], ...] = (
                ("_read_to_send", staticmethod(read_held), export),
                ("_write_received", write_held, import_),  # a method: it checks the disk's room
            )
            for name, replacement, transfer in replacements:
                held.clear()
                release.clear()
                monkeypatch.setattr(ObjectAdmin, name, replacement)
                worker = threading.Thread(target=transfer)
                worker.start()
                try:
                    assert held.wait(timeout=60), f"{name} was not reached"
                    other = pb.GetObjectStatsRequest(object_key="other")
                    assert stub.GetObjectStats(other, metadata=routing_metadata("other"), timeout=10).message_rows == 1
                finally:
                    release.set()
                    worker.join(timeout=60)
                monkeypatch.undo()
            assert len(exported) == 1 and exported[0].startswith(b"SQLite format 3")
            assert len(imported) == 1
            assert client.object("copy").session().get_history() == [_message("m1", 1000)]
    finally:
        release.set()
        channel.close()
        server.stop()


def test_an_import_is_answered_by_what_it_installed_even_when_an_erase_follows_at_once(tmp_path: Path) -> None:
    """The import counted the installed file's rows after reopening the object to calls: an
    erase let in then took the file from under the count, and an import that had installed its
    file was answered INTERNAL (7 of 200 such pairs here). Each pair starts its erase as the
    import's last frame leaves, a few calls later each time, to meet the install at its end."""
    import asyncio
    import json

    server = start_server(tmp_path / "data")

    async def pairs() -> set[tuple[str, str]]:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            for index in range(20):
                message = json.dumps(_message(f"m{index}", 100))
                await stub.AppendMessage(pb.AppendMessageRequest(object_key="source", message_json=message))
            export = stub.ExportObject(pb.ExportObjectRequest(object_key="source"))
            data = b"".join([frame.data async for frame in export])
            frame = pb.ImportObjectRequest(data=data, sha256=hashlib.sha256(data).hexdigest())
            return {await _import_then_erase(stub, f"target{n}", frame, n % 4) for n in range(120)}

    try:
        outcomes = asyncio.run(pairs())
    finally:
        server.stop()
    assert outcomes == {("imported 20", "erased")}


async def _import_then_erase(
    stub: pb_grpc.SessionServiceStub, key: str, frame: pb.ImportObjectRequest, calls_between: int
) -> tuple[str, str]:
    """Imports `frame` as `key`; erases `key` once the frame has left, `calls_between` calls later."""
    import asyncio

    sent = asyncio.Event()

    async def frames() -> Any:
        yield pb.ImportObjectRequest(object_key=key, data=frame.data, sha256=frame.sha256)
        sent.set()

    async def imported() -> str:
        try:
            return f"imported {(await stub.ImportObject(frames())).message_rows}"
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"

    async def erased() -> str:
        await sent.wait()
        for _ in range(calls_between):
            await stub.GetObjectStats(pb.GetObjectStatsRequest(object_key="source"))
        try:
            await stub.DeleteObject(pb.DeleteObjectRequest(object_key=key, erase=True))
            return "erased"
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"

    import_outcome, erase_outcome = await asyncio.gather(imported(), erased())
    return import_outcome, erase_outcome


def test_an_empty_file_is_refused_and_replaces_nothing(tmp_path: Path) -> None:
    """No data and the digest of nothing is a valid SQLite database (0 bytes): it was installed
    as an empty object, and with `replace` it took the place of one holding messages."""
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
            client.object("kept").session().append_message(_message("m1", 10))
            stub = pb_grpc.SessionServiceStub(channel)
            empty = hashlib.sha256(b"").hexdigest()
            for key, replace in (("kept", True), ("new", False)):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ImportObject(
                        iter([pb.ImportObjectRequest(object_key=key, replace=replace, sha256=empty)]),
                        metadata=routing_metadata(key),
                    )
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "empty database" in (refused.value.details() or "")
            assert client.object("kept").session().get_history() == [_message("m1", 10)]
            assert list(stub.ListObjects(pb.ListObjectsRequest()).object_keys) == ["kept"]
    finally:
        server.stop()


def test_files_whose_names_hold_uri_characters_are_saved_and_sent_as_themselves(tmp_path: Path) -> None:
    """`export_file` counted the rows of, and `import_file` copied, `file:{path}?mode=ro`: a `?` or
    `#` in the name cut the path short, and SQLite made an empty database there instead."""
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            client.object("source").session().append_messages([_message("m1", 10), _message("m2", 10)])
            saved = export_file(client, "source", tmp_path / "a?b#c.sqlite")
            assert saved.message_rows == 2
            assert import_file(client, "copy", saved.path).message_rows == 2
            assert [m["id"] for m in client.object("copy").session().get_history()] == ["m1", "m2"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a?b#c.sqlite", "data"]
    finally:
        server.stop()


_COMPACTION = (
    "INSERT INTO cf_agents_session_compactions (session_id, id, seq, summary, from_message_id, to_message_id,"
    " created_at) VALUES ('', 'c1', 1, 'a summary', 'm1', 'm1', 1);"
)


def _store_file(path: Path, script: str) -> bytes:
    """The bytes of a store made by the service's schema, one message, then `script`."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.isolation_level = None
        schema.initialize(conn, "origin")
        conn.execute(
            "INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at)"
            """ VALUES ('', 'm1', 1, 'user', '{"id":"m1","role":"user","parts":[]}', 1)"""
        )
        conn.executescript(script)
        conn.execute("PRAGMA journal_mode = DELETE")  # the file alone holds it all
    return path.read_bytes()


def _send(stub: pb_grpc.SessionServiceStub, key: str, data: bytes) -> None:
    frames = [
        pb.ImportObjectRequest(object_key=key, replace=True, data=data),
        pb.ImportObjectRequest(sha256=hashlib.sha256(data).hexdigest()),
    ]
    stub.ImportObject(iter(frames), metadata=routing_metadata(key))


def test_a_file_carrying_a_trigger_or_an_oversized_read_is_refused_and_replaces_nothing(tmp_path: Path) -> None:
    """A security audit's findings, through the server: a trigger imported with a file ran in
    every later append on the shared write threads; a message naming one stored payload many
    times read back far past --max-assembly-bytes, which the write calls refuse."""
    payload = bytes(range(256)) * 40  # 10,240 bytes: 13,656 in base64
    digest = hashlib.sha256(payload).hexdigest()
    pointer = {"type": "file", "mediaType": "image/png", "url": f"attachment:sha256:{digest}"}
    amplified = json.dumps({"id": "big", "role": "user", "parts": [pointer] * 100})  # reads back as ~1.4 MB
    trigger = _store_file(
        tmp_path / "trigger.sqlite",
        "CREATE TRIGGER evil AFTER INSERT ON cf_agents_session_messages BEGIN SELECT 1; END;",
    )
    amplifying = _store_file(
        tmp_path / "amplifying.sqlite",
        f"INSERT INTO cf_agents_session_attachment_chunks VALUES ('{digest}', 0, x'{payload.hex()}');"
        f"INSERT INTO cf_agents_session_attachment_meta VALUES ('{digest}', {len(payload)}, 'image/png', 1);"
        "INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at)"
        f" VALUES ('', 'big', 2, 'user', '{amplified}', 1);",
    )
    server = start_server(tmp_path / "data", limits=Limits(max_assembly_bytes=1024 * 1024))
    try:
        with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
            client.object("kept").session().append_message(_message("m1", 10))
            stub = pb_grpc.SessionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                _send(stub, "kept", trigger)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (refused.value.details() or "") == (
                "the received file cannot be served: it holds a trigger ('evil'); a store holds none"
            )
            with pytest.raises(grpc.RpcError) as too_large:
                _send(stub, "kept", amplifying)
            error = SessionsError.from_rpc_error(too_large.value)
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_EXCEEDED")
            assert error.metadata["limit"] == "max_assembly_bytes"
            assert "id 'big': its JSON with its attachments inline is" in error.message
            assert client.object("kept").session().get_history() == [_message("m1", 10)]
            assert list(stub.ListObjects(pb.ListObjectsRequest()).object_keys) == ["kept"]
    finally:
        server.stop()


def test_an_object_the_server_stored_imports_again_under_its_limits(tmp_path: Path) -> None:
    """A text that quotes an attachment's pointer is no place a read restores it, and the write
    calls do not count it: the import's read-back bound counted every pointer's text, so an
    object the server had stored could not be exported and imported (nor moved) again (a
    review's finding)."""
    image = bytes(range(256)) * 800  # 204,800 bytes: 273,068 in base64
    digest = hashlib.sha256(image).hexdigest()
    data_url = "data:image/png;base64," + base64.b64encode(image).decode()
    server = start_server(tmp_path / "data", limits=Limits(max_assembly_bytes=1024 * 1024))
    try:
        with SessionsClient(server.address) as client:
            session = client.object("stored").session()
            session.append_message(
                {"id": "img", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": data_url}]}
            )
            quote = {"type": "text", "text": f"attachment:sha256:{digest} " * 10}
            session.append_message({"id": "quote", "role": "user", "parts": [quote]})
            export_file(client, "stored", tmp_path / "stored.sqlite")
            import_file(client, "copy", tmp_path / "stored.sqlite")
            assert [m["id"] for m in client.object("copy").session().get_history()] == ["img", "quote"]
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("column", "script"),
    [
        ("role", "UPDATE cf_agents_session_messages SET role = CAST(x'61ff62' AS TEXT)"),
        ("parent_id", "UPDATE cf_agents_session_messages SET parent_id = CAST(x'61ff62' AS TEXT)"),
        ("summary", _COMPACTION + "UPDATE cf_agents_session_compactions SET summary = CAST(x'61ff62' AS TEXT)"),
        (
            "from_message_id",
            _COMPACTION + "UPDATE cf_agents_session_compactions SET from_message_id = CAST(x'61ff62' AS TEXT)",
        ),
        ("content", "UPDATE cf_agents_session_messages SET content = CAST(x'7bff7d' AS TEXT)"),
    ],
)
def test_a_file_holding_a_text_that_is_not_utf8_is_refused_and_replaces_nothing(
    tmp_path: Path, column: str, script: str
) -> None:
    """Some columns of a received file were never read on the way in: one holding bytes that
    are not UTF-8 (a role, a parent id, a compaction's summary) was installed, replacing a
    healthy object, and every call on it then answered DATA_LOSS, the object taken for damaged."""
    bad = _store_file(tmp_path / "bad.sqlite", script)
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
            client.object("kept").session().append_message(_message("m1", 10))
            stub = pb_grpc.SessionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                _send(stub, "kept", bad)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
            assert f"its {column} is not UTF-8 text" in (refused.value.details() or "")
            assert client.object("kept").session().get_history() == [_message("m1", 10)]
    finally:
        server.stop()
