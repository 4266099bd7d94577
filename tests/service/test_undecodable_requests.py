"""A request whose string field holds bytes that are not UTF-8 is refused INVALID_FIELD naming
that field, nested items included. The decoder refuses the whole request ("String field had
bad UTF-8"), and the error named no field: a caller with a batch of many items had to guess."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.transport.wire import MAX_FIELDS_WALKED, undecodable_string_field
from tests.conftest import start_server

PLACEHOLDER = "\u2603\u2603"  # protobuf serializes only valid text: replaced by the byte 0xff after


def _serialized(request: pb.AppendMessagesRequest | pb.AppendMessageRequest | pb.ImportMessagesRequest) -> bytes:
    return request.SerializeToString().replace(PLACEHOLDER.encode(), b"\xff")


def _message(message_id: str, text: str = "hi") -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}, ensure_ascii=False)


CASES = [
    ("AppendMessage", pb.AppendMessageRequest(object_key="k" + PLACEHOLDER, message_json=_message("a")), "object_key"),
    (
        "AppendMessages",
        pb.AppendMessagesRequest(
            object_key="k",
            items=[
                pb.AppendItem(message_json=_message("a")),
                pb.AppendItem(message_json=_message("b", PLACEHOLDER)),
            ],
        ),
        "items[1].message_json",
    ),
    (
        "ImportMessages",
        pb.ImportMessagesRequest(
            object_key="k", messages=[pb.ImportedMessage(json=_message("a"), parent_id="p" + PLACEHOLDER)]
        ),
        "messages[0].parent_id",
    ),
]


@pytest.mark.parametrize(("method", "request_message", "field"), CASES, ids=[case[2] for case in CASES])
def test_the_field_that_is_not_utf8_is_named(tmp_path: Path, method: str, request_message: object, field: str) -> None:
    server = start_server(tmp_path / "data")
    try:
        with grpc.insecure_channel(server.address) as channel:
            identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
            path = f"/sessions.v1.SessionService/{method}"
            data = _serialized(request_message)  # type: ignore[arg-type]
            with pytest.raises(grpc.RpcError) as refused:
                if method == "ImportMessages":
                    channel.stream_unary(path, **identity)(iter([data]), timeout=30)
                else:
                    channel.unary_unary(path, **identity)(data, timeout=30)
            error = SessionsError.from_rpc_error(refused.value)
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
            assert error.metadata.get("field") == field, error
            assert f"its {field} is not UTF-8 text" in error.message
            listed = channel.unary_unary("/sessions.v1.SessionService/ListObjects", **identity)(
                pb.ListObjectsRequest().SerializeToString(), timeout=30
            )
            assert list(pb.ListObjectsResponse.FromString(listed).object_keys) == []  # nothing written
    finally:
        server.stop()


def test_data_not_well_formed_names_no_field() -> None:
    descriptor = pb.AppendMessageRequest.DESCRIPTOR
    assert undecodable_string_field(descriptor, b"\x0a\x05ab") is None  # a length past the end
    assert undecodable_string_field(descriptor, b"\x0a\x80") is None  # a length cut short
    assert undecodable_string_field(descriptor, b"\x0a\x02ok\x1a\x02\xff\xfe") == "message_json"
    assert undecodable_string_field(descriptor, b"\x0a\x02ok") is None


def test_the_walk_gives_up_after_its_budget_of_fields() -> None:
    """It runs on the event loop: a 60 MB request of tiny fields held it 11 s."""
    tiny = b"\x20\x01" * (MAX_FIELDS_WALKED + 1)  # parent_mode varints
    descriptor = pb.AppendMessageRequest.DESCRIPTOR
    assert undecodable_string_field(descriptor, tiny + b"\x0a\x02\xff\xfe") is None
    assert undecodable_string_field(descriptor, tiny[:-4] + b"\x0a\x02\xff\xfe") == "object_key"


def test_an_import_refused_for_a_frame_it_cannot_decode_says_what_it_stored(tmp_path: Path) -> None:
    """An import is not all or nothing: the messages of the frames before the bad one stay, and
    every other refusal of an import says so. This one said only that the frame could not be
    decoded, and the caller could take the import for not begun."""
    server = start_server(tmp_path / "data")
    try:
        with grpc.insecure_channel(server.address) as channel:
            identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
            first = pb.ImportMessagesRequest(object_key="k", messages=[pb.ImportedMessage(json=_message("a"))])
            bad = pb.ImportMessagesRequest(messages=[pb.ImportedMessage(json=_message("b", PLACEHOLDER))])
            with pytest.raises(grpc.RpcError) as refused:
                channel.stream_unary("/sessions.v1.SessionService/ImportMessages", **identity)(
                    iter([_serialized(first), _serialized(bad)]), timeout=30
                )
            error = SessionsError.from_rpc_error(refused.value)
            assert (error.code, error.metadata.get("field")) == (grpc.StatusCode.INVALID_ARGUMENT, "messages[0].json")
            assert "the message before it is stored (an import is not all or nothing)" in error.message, error
            frames = channel.unary_stream("/sessions.v1.SessionService/GetMessage", **identity)(
                pb.GetMessageRequest(object_key="k", message_id="a").SerializeToString(), timeout=30
            )
            assert [json.loads(pb.GetMessageResponse.FromString(f).frame.json)["id"] for f in frames] == ["a"]
    finally:
        server.stop()
