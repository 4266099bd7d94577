"""A move's import that replaced an object taking writes here keeps a copy of it until its hold
ends: the move failing (the copy dropped) puts it back, the move ending (the hold released)
lets it go. A mover stalled while an operator moved the object here by another run replaced
that object with its own stale copy, then dropped it when its delete was refused: every write
since the other move, acknowledged ones included, was lost."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.datadir import HELD_DIR_NAME
from sessions_server.storage.paths import object_path
from tests.conftest import start_server
from tests.service.support import exported, text_message

KEY = "k"


def _exported(stub: pb_grpc.SessionServiceStub, key: str) -> bytes:
    return b"".join(frame.data for frame in exported(stub, key))


def _held_import(stub: pb_grpc.SessionServiceStub, data: bytes) -> str:
    """ImportObject of `data` as KEY, replacing what is there and held for a move: the hold's id."""
    frames = [
        pb.ImportObjectRequest(object_key=KEY, replace=True, hold_for_move=True, data=data),
        pb.ImportObjectRequest(sha256=hashlib.sha256(data).hexdigest()),
    ]
    return str(stub.ImportObject(iter(frames), metadata=routing_metadata(KEY)).move_id)


def _ids(client: SessionsClient) -> list[str]:
    return [str(m["id"]) for m in client.object(KEY).session().get_history()]


def _kept(data: Path) -> list[str]:
    held = data / HELD_DIR_NAME
    return sorted(p.name for p in held.iterdir()) if held.exists() else []


def test_a_dropped_import_puts_back_the_object_it_replaced_restarts_included(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            client.object("stale").session().append_message(text_message("s1", "a stale copy"))
            stale = _exported(stub, "stale")
            client.object(KEY).session().append_message(text_message("m1", "the object here"))
            client.object(KEY).session().append_message(text_message("m2", "acknowledged since"))

            hold = _held_import(stub, stale)
            assert _ids(client) == ["s1"] and len(_kept(data)) == 1
            request = pb.DeleteObjectRequest(object_key=KEY, erase=True, move_id=hold)  # the move failed
            assert stub.DeleteObject(request, metadata=routing_metadata(KEY)).deleted
            assert _ids(client) == ["m1", "m2"] and _kept(data) == []
            assert client.object(KEY).session().append_message(text_message("m3")).inserted  # takes writes

            hold = _held_import(stub, stale)  # once more, then the server restarts while it holds
            assert len(_kept(data)) == 1
    finally:
        server.stop()
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            assert _ids(client) == ["s1"]
            request = pb.DeleteObjectRequest(object_key=KEY, erase=True, move_id=hold)
            assert stub.DeleteObject(request, metadata=routing_metadata(KEY)).deleted
            assert _ids(client) == ["m1", "m2", "m3"] and _kept(data) == []
    finally:
        server.stop()


def test_a_released_import_lets_the_replaced_object_go(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / HELD_DIR_NAME).mkdir(parents=True)
    (data / HELD_DIR_NAME / "left-by-a-crash.sqlite").write_bytes(b"")  # no hold names it: removed at start
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            assert _kept(data) == []
            client.object("arriving").session().append_message(text_message("a1", "the source's"))
            arriving = _exported(stub, "arriving")
            client.object(KEY).session().append_message(text_message("m1", "replaced by the move"))
            _held_import(stub, arriving)
            assert stub.AbortMove(pb.AbortMoveRequest(object_key=KEY), metadata=routing_metadata(KEY)).was_locked
            assert _ids(client) == ["a1"] and _kept(data) == []
            assert client.object(KEY).session().append_message(text_message("a2")).inserted
    finally:
        server.stop()


def test_a_held_import_replaces_a_damaged_object_keeping_nothing_of_it(tmp_path: Path) -> None:
    """Its copy could not be read, and the import answered INTERNAL: a move with --replace, the
    documented repair of a damaged object, was refused."""
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            client.object("arriving").session().append_message(text_message("a1", "the source's"))
            arriving = _exported(stub, "arriving")
            client.object(KEY).session().append_message(text_message("m1", "soon damaged"))
    finally:
        server.stop()
    damaged = object_path(data, KEY)
    damaged.write_bytes(b"not a database " * 1000)
    for suffix in ("-wal", "-shm"):
        Path(str(damaged) + suffix).unlink(missing_ok=True)
    server = start_server(data)
    try:
        with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            _held_import(stub, arriving)
            assert _kept(data) == []
            assert stub.AbortMove(pb.AbortMoveRequest(object_key=KEY), metadata=routing_metadata(KEY)).was_locked
            assert _ids(client) == ["a1"]
    finally:
        server.stop()
