"""Reads of an object never written answer as an empty object does, and create no file: a
`read` token must not be able to fill the disk with empty objects, nor a mistyped key appear
in ListObjects."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.service.support import files_under, listed_object_keys, object_file, text_message

Outcome = tuple[str, Any]
Call = Callable[[pb_grpc.SessionServiceStub, str], Any]

# Each read the contract has, as a stub call on an object key; streams are collected.
READS: dict[str, Call] = {
    "GetMessage": lambda stub, key: stub.GetMessage(pb.GetMessageRequest(object_key=key, message_id="m1")),
    "GetMessages": lambda stub, key: stub.GetMessages(pb.GetMessagesRequest(object_key=key, message_ids=["m1", "m2"])),
    "GetLatestLeaf": lambda stub, key: stub.GetLatestLeaf(pb.GetLatestLeafRequest(object_key=key)),
    "GetBranches": lambda stub, key: stub.GetBranches(pb.GetBranchesRequest(object_key=key, message_id="m1")),
    "StreamHistory": lambda stub, key: stub.StreamHistory(pb.StreamHistoryRequest(object_key=key)),
    "StreamHistory newest first": lambda stub, key: stub.StreamHistory(
        pb.StreamHistoryRequest(object_key=key, newest_first=True)
    ),
    "GetRecentHistory": lambda stub, key: stub.GetRecentHistory(
        pb.GetRecentHistoryRequest(object_key=key, max_content_bytes=4096)
    ),
    "GetHistoryRowStats": lambda stub, key: stub.GetHistoryRowStats(pb.GetHistoryRowStatsRequest(object_key=key)),
    "ReadAttachment": lambda stub, key: stub.ReadAttachment(pb.ReadAttachmentRequest(object_key=key, hash="a" * 64)),
    "SearchMessages": lambda stub, key: stub.SearchMessages(pb.SearchMessagesRequest(object_key=key, query="hello")),
    "ListCompactions": lambda stub, key: stub.ListCompactions(pb.ListCompactionsRequest(object_key=key)),
    "PlanCompaction": lambda stub, key: stub.PlanCompaction(pb.PlanCompactionRequest(object_key=key)),
    "GetCompactionPolicy": lambda stub, key: stub.GetCompactionPolicy(pb.GetCompactionPolicyRequest(object_key=key)),
    "DeleteMessages": lambda stub, key: stub.DeleteMessages(
        pb.DeleteMessagesRequest(object_key=key, message_ids=["m1"])
    ),
    "ClearMessages": lambda stub, key: stub.ClearMessages(pb.ClearMessagesRequest(object_key=key)),
}


def outcome(call: Call, stub: pb_grpc.SessionServiceStub, key: str) -> Outcome:
    """The answer, or the refusal's code and message, with the key taken out of the text."""
    try:
        answer = call(stub, key)
        return "ok", list(answer) if not hasattr(answer, "DESCRIPTOR") else answer
    except grpc.RpcError as exc:
        return exc.code().name, (exc.details() or "").replace(key, "<key>")


def emptied_object(stub: pb_grpc.SessionServiceStub, key: str) -> None:
    """An object whose file exists and whose default session is empty again."""
    stub.AppendMessage(pb.AppendMessageRequest(object_key=key, message_json=json.dumps(text_message("m0"))))
    stub.ClearMessages(pb.ClearMessagesRequest(object_key=key))


@pytest.mark.parametrize("read", list(READS))
def test_a_read_of_an_absent_object_answers_as_an_empty_one(
    stub: pb_grpc.SessionServiceStub, data_dir: Path, read: str
) -> None:
    absent, empty = f"absent-{uuid.uuid4().hex}", f"empty-{uuid.uuid4().hex}"
    emptied_object(stub, empty)

    assert outcome(READS[read], stub, absent) == outcome(READS[read], stub, empty)
    assert not object_file(data_dir, absent).exists()


def test_reads_of_absent_objects_leave_the_data_directory_as_it_was(
    stub: pb_grpc.SessionServiceStub, data_dir: Path
) -> None:
    keys = [f"never-{uuid.uuid4().hex}" for _ in range(5)]
    before = files_under(data_dir / "objects")
    for key in keys:
        for call in READS.values():
            outcome(call, stub, key)
        sessions = stub.ListSessions(pb.ListSessionsRequest(object_key=key))
        assert list(sessions.sessions) == []
        stats = stub.GetObjectStats(pb.GetObjectStatsRequest(object_key=key))
        assert stats == pb.GetObjectStatsResponse()

    assert files_under(data_dir / "objects") == before
    assert listed_object_keys(stub).isdisjoint(keys)


def test_the_first_write_after_reads_creates_the_object(client: Any, data_dir: Path) -> None:
    key = f"later-{uuid.uuid4().hex}"
    session = client.object(key).session()
    assert session.get_history() == []
    assert session.search("hello") == []
    session.append_message(text_message("m1", "hello"))

    assert object_file(data_dir, key).exists()
    assert [message["id"] for message in session.get_history()] == ["m1"]
    assert [hit.id for hit in session.search("hello")] == ["m1"]
