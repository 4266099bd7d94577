"""Every write to a key this server moved away is refused FAILED_PRECONDITION / OBJECT_NOT_OWNED,
naming the new owner, so that a client can go there: also the writes that would store nothing
(an overlay id, which upstream answers without writing; an empty batch). Those answered OK, as
if the object were still here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import start_server

KEY = "moved"


def _json(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": "hi"}]})


WRITES: dict[str, Callable[[Any], Any]] = {
    "append": lambda stub: stub.AppendMessage(pb.AppendMessageRequest(object_key=KEY, message_json=_json("m2"))),
    "append_overlay_id": lambda stub: stub.AppendMessage(
        pb.AppendMessageRequest(object_key=KEY, message_json=_json("compaction_x"))
    ),
    "batch_of_overlay_ids": lambda stub: stub.AppendMessages(
        pb.AppendMessagesRequest(object_key=KEY, items=[pb.AppendItem(message_json=_json("compaction_y"))])
    ),
    "empty_batch": lambda stub: stub.AppendMessages(pb.AppendMessagesRequest(object_key=KEY)),
    "update_overlay_id": lambda stub: stub.UpdateMessage(
        pb.UpdateMessageRequest(object_key=KEY, message_json=_json("compaction_x"))
    ),
    "upsert_overlay_id": lambda stub: stub.UpsertMessage(
        pb.UpsertMessageRequest(object_key=KEY, message_json=_json("compaction_x"))
    ),
}


def _held_for_a_move(stub: pb_grpc.SessionServiceStub) -> list[pb.ExportObjectResponse]:
    """Writes message m1 to KEY, then exports the object with a move's lock: its frames."""
    stub.AppendMessage(
        pb.AppendMessageRequest(object_key=KEY, message_json=_json("m1")), metadata=routing_metadata(KEY)
    )
    return list(stub.ExportObject(pb.ExportObjectRequest(object_key=KEY, lock_for_move=True)))


def test_writes_to_a_key_moved_away_are_refused_naming_its_owner(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            metadata = routing_metadata(KEY)
            frames = _held_for_a_move(stub)
            stub.DeleteObject(
                pb.DeleteObjectRequest(object_key=KEY, move_id=frames[-1].move_id, moved_to="new-owner:1"),
                metadata=metadata,
            )
            refused = {}
            for name, write in WRITES.items():
                with pytest.raises(grpc.RpcError) as caught:
                    write(stub)
                refused[name] = (caught.value.code(), "new-owner:1" in (caught.value.details() or ""))
    finally:
        server.stop()
    assert refused == {name: (grpc.StatusCode.FAILED_PRECONDITION, True) for name in WRITES}


def test_an_object_held_for_a_move_is_searched_though_its_index_was_never_built(tmp_path: Path) -> None:
    """Reads go on while a move holds an object's writes; the first search builds the object's
    search index, by writes of its own, which the move's lock refused: every search answered
    OBJECT_MOVING until the lock went (deadlines audit, session 49). The index is derived from
    the rows, so its writes pass the lock; the rows' stay refused."""
    server = start_server(tmp_path / "data")
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            metadata = routing_metadata(KEY)
            assert _held_for_a_move(stub)[-1].move_id
            hits = list(stub.SearchMessages(pb.SearchMessagesRequest(object_key=KEY, query="hi"), metadata=metadata))
            assert [hit.id for hit in hits] == ["m1"]
            with pytest.raises(grpc.RpcError) as held:
                WRITES["append"](stub)
            assert held.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "moved" in (held.value.details() or "")
    finally:
        server.stop()
