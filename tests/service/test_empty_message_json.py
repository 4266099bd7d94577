"""A write whose message JSON field was left out (the empty string) is told so plainly.

It was answered "message_json is not valid JSON: invalid JSON at line 1 column 1: Expecting
value", which sent its reader looking for a typo in JSON never sent. Now every write path says the
field is empty, with the same code, reason and field as any other JSON it cannot parse, and writes
nothing; JSON that is there but broken is still told where it breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import listed_object_keys, message_rows, object_file, text_message, violated_field

EMPTY = "is empty: it must hold the message as a JSON object"
GOOD = '{"id":"g","role":"user","parts":[]}'


def _import(key: str, *messages: pb.ImportedMessage) -> Any:
    return iter([pb.ImportMessagesRequest(object_key=key), pb.ImportMessagesRequest(messages=list(messages))])


def _upload(key: str, operation: pb.UploadOperation.ValueType, piece: str) -> Any:
    return iter(
        [pb.UploadMessageRequest(header=pb.UploadHeader(object_key=key, operation=operation), json_piece=piece)]
    )


# The call, with its message JSON left empty, and the field's path in the request.
EMPTY_CALLS: dict[str, tuple[Callable[[Any, str], Any], str]] = {
    "AppendMessage": (lambda stub, key: stub.AppendMessage(pb.AppendMessageRequest(object_key=key)), "message_json"),
    "AppendMessages": (
        lambda stub, key: stub.AppendMessages(
            pb.AppendMessagesRequest(object_key=key, items=[pb.AppendItem(message_json=GOOD), pb.AppendItem()])
        ),
        "items[1].message_json",
    ),
    "UpdateMessage": (lambda stub, key: stub.UpdateMessage(pb.UpdateMessageRequest(object_key=key)), "message_json"),
    "UpsertMessage": (lambda stub, key: stub.UpsertMessage(pb.UpsertMessageRequest(object_key=key)), "message_json"),
    "UploadMessage append": (
        lambda stub, key: stub.UploadMessage(_upload(key, pb.UPLOAD_OPERATION_APPEND, "")),
        "json_piece",
    ),
    "UploadMessage update": (
        lambda stub, key: stub.UploadMessage(_upload(key, pb.UPLOAD_OPERATION_UPDATE, "")),
        "json_piece",
    ),
    "ImportMessages": (
        # Alone: an import writes each message as it arrives, so those before a refused one stay.
        lambda stub, key: stub.ImportMessages(_import(key, pb.ImportedMessage(created_at_ms=1))),
        "messages[0].json",
    ),
}


def _state(data_dir: Path, object_key: str) -> list[dict[str, Any]]:
    return message_rows(data_dir, object_key, None)


def _refusal(call: Callable[[], Any]) -> tuple[grpc.RpcError, SessionsError, str]:
    """The error, as the Python client reads it, and its BadRequest field violation's field."""
    with pytest.raises(grpc.RpcError) as refused:
        call()
    error = refused.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    return error, SessionsError.from_rpc_error(error), violated_field(error)


@pytest.mark.parametrize("call", EMPTY_CALLS)
def test_an_empty_message_json_is_refused_as_empty_and_nothing_is_written(
    stub: Any, session: Any, data_dir: Path, object_key: str, call: str
) -> None:
    session.append_message(text_message("a"))
    before = _state(data_dir, object_key)
    send, field = EMPTY_CALLS[call]

    error, read, violated = _refusal(lambda: send(stub, object_key))

    assert read.reason == "INVALID_JSON"
    assert read.metadata.get("field") == field
    assert violated == field
    assert f"{field} {EMPTY}" in (error.details() or ""), error.details()
    assert "Expecting value" not in (error.details() or "")
    assert _state(data_dir, object_key) == before
    # nothing consumed a seq or moved the leaf
    assert session.append_message(text_message("b")).parent_id == "a"


@pytest.mark.parametrize("call", EMPTY_CALLS)
def test_an_empty_message_json_on_a_new_object_creates_nothing(
    stub: Any, data_dir: Path, object_key: str, call: str
) -> None:
    send, field = EMPTY_CALLS[call]
    _, read, _ = _refusal(lambda: send(stub, object_key))
    assert (read.reason, read.metadata.get("field")) == ("INVALID_JSON", field)
    assert not object_file(data_dir, object_key).exists()
    assert object_key not in listed_object_keys(stub)


def test_the_empty_message_is_answered_as_such_through_the_client(session: Any) -> None:
    with pytest.raises(SessionsError) as caught:
        session.append_message("")
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "INVALID_JSON"
    assert caught.value.metadata.get("field") == "message_json"
    assert caught.value.metadata.get("detail") == "empty: it must hold the message as a JSON object"


@pytest.mark.parametrize("raw", [" ", "{", "not json"], ids=["blank", "truncated", "words"])
def test_json_that_is_there_but_broken_is_still_told_where_it_breaks(
    stub: Any, session: Any, data_dir: Path, object_key: str, raw: str
) -> None:
    session.append_message(text_message("a"))
    before = _state(data_dir, object_key)
    error, read, violated = _refusal(
        lambda: stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=raw))
    )
    assert (read.reason, read.metadata.get("field"), violated) == ("INVALID_JSON", "message_json", "message_json")
    assert (error.details() or "").startswith("message_json is not valid JSON: invalid JSON at line 1")
    assert _state(data_dir, object_key) == before


@pytest.mark.parametrize(
    ("raw", "told"),
    [
        ('{"id":"a","role":"user","parts":[{"type":"text","text":"a\tb"}]}', "a control character (U+0009) inside"),
        ('{"id":"a","role":"user","parts":[{"type":"text","text":"ab', "column 56: Unterminated string"),
    ],
    ids=["control-character", "unterminated"],
)
def test_a_decoder_message_that_ends_in_at_is_told_whole(stub: Any, object_key: str, raw: str, told: str) -> None:
    """The standard library's decoder says "Invalid control character at" and "Unterminated
    string starting at", its own text adding the place: quoted after ours, the message ended in
    a dangling "at"."""
    error, _, _ = _refusal(lambda: stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=raw)))
    details = error.details() or ""
    assert told in details and not details.endswith(" at"), details
