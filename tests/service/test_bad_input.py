"""Bad input on every write path: INVALID_ARGUMENT with the documented ErrorInfo reason, and
nothing written (DESIGN.md §4, §9; proto ErrorReason)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import ImportItem, SessionsError
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import (
    error_reason,
    listed_object_keys,
    message_rows,
    object_file,
    open_readonly,
    text_message,
    violated_field,
)

BAD_MESSAGES = [
    ('{"id":"x","role":"user","parts":[]', "INVALID_JSON"),
    ("not json at all", "INVALID_JSON"),
    ("", "INVALID_JSON"),
    ('{"id":"x","role":"user","parts":[]} trailing', "INVALID_JSON"),
    ('["id","role"]', "INVALID_MESSAGE"),
    ('"a string"', "INVALID_MESSAGE"),
    ("42", "INVALID_MESSAGE"),
    ("null", "INVALID_MESSAGE"),
    ('{"role":"user","parts":[]}', "INVALID_MESSAGE"),
    ('{"id":7,"role":"user","parts":[]}', "INVALID_MESSAGE"),
    ('{"id":null,"role":"user","parts":[]}', "INVALID_MESSAGE"),
    ('{"id":"x","parts":[]}', "INVALID_MESSAGE"),
    ('{"id":"x","role":["user"],"parts":[]}', "INVALID_MESSAGE"),
    ('{"id":"x","role":"user"}', "INVALID_MESSAGE"),
    ('{"id":"x","role":"user","parts":{}}', "INVALID_MESSAGE"),
    ('{"id":"x","role":"user","parts":"text"}', "INVALID_MESSAGE"),
    ('{"id":"x","role":"user","parts":[{"text":"no type"}]}', "INVALID_MESSAGE"),
    ('{"id":"x","role":"user","parts":[{"type":3}]}', "INVALID_MESSAGE"),
    ('{"id":"x","role":"user","parts":["text"]}', "INVALID_MESSAGE"),
    ('{"id":"x","role":"user","parts":[{"type":"text","text":"ok"},null]}', "INVALID_MESSAGE"),
]
BAD_IDS = [
    "truncated",
    "not-json",
    "empty",
    "trailing",
    "array",
    "string",
    "number",
    "null",
    "no-id",
    "numeric-id",
    "null-id",
    "no-role",
    "array-role",
    "no-parts",
    "parts-object",
    "parts-string",
    "part-without-type",
    "part-numeric-type",
    "part-string",
    "part-null",
]


def file_state(data_dir: Path, object_key: str) -> tuple[list[dict[str, Any]], int]:
    """All message rows (every session) and the number of continuation rows."""
    with open_readonly(object_file(data_dir, object_key)) as conn:
        chunks = conn.execute("SELECT count(*) FROM cf_agents_session_message_chunks").fetchone()[0]
    return message_rows(data_dir, object_key, None), chunks


@pytest.mark.parametrize(("raw", "reason"), BAD_MESSAGES, ids=BAD_IDS)
def test_append_rejects_bad_message(session: Any, data_dir: Path, object_key: str, raw: str, reason: str) -> None:
    session.append_message(text_message("a"))
    before = file_state(data_dir, object_key)

    with pytest.raises(SessionsError) as caught:
        session.append_message(raw)

    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == reason
    assert file_state(data_dir, object_key) == before
    # nothing consumed a seq or moved the leaf
    nxt = session.append_message(text_message("b"))
    assert nxt.parent_id == "a"
    assert message_rows(data_dir, object_key)[-1]["seq"] == 2


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"id":"a","role":"user","parts":[}', "INVALID_JSON"),
        ('{"id":"a","parts":[]}', "INVALID_MESSAGE"),
        ('{"id":"a","role":"user","parts":{}}', "INVALID_MESSAGE"),
        ('{"id":"a","role":"user","parts":[{"type":null}]}', "INVALID_MESSAGE"),
        ("[]", "INVALID_MESSAGE"),
    ],
    ids=["json", "no-role", "parts-object", "part-null-type", "array"],
)
@pytest.mark.parametrize("operation", ["update", "upsert"])
def test_update_and_upsert_reject_bad_message(
    session: Any, data_dir: Path, object_key: str, raw: str, reason: str, operation: str
) -> None:
    session.append_message(text_message("a", "original"))
    before = file_state(data_dir, object_key)

    with pytest.raises(SessionsError) as caught:
        if operation == "update":
            session.update_message(raw)
        else:
            session.upsert_message(raw)

    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == reason
    assert file_state(data_dir, object_key) == before


def test_update_of_absent_id_without_role_is_invalid(session: Any, data_dir: Path, object_key: str) -> None:
    """DESIGN.md §9: a message without a string role is rejected on every path (upstream would
    return null here)."""
    session.append_message(text_message("a"))
    with pytest.raises(SessionsError) as caught:
        session.update_message('{"id":"missing","parts":[]}')
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "INVALID_MESSAGE"


def test_duplicate_append_without_role_is_invalid(session: Any, data_dir: Path, object_key: str) -> None:
    """DESIGN.md §9 (upstream would return the stored row)."""
    session.append_message(text_message("a"))
    with pytest.raises(SessionsError) as caught:
        session.append_message('{"id":"a","parts":[]}')
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "INVALID_MESSAGE"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"id":"b","role":"user","parts":[', "INVALID_JSON"),
        ('{"id":"b","parts":[]}', "INVALID_MESSAGE"),
        ('{"id":"b","role":"user","parts":7}', "INVALID_MESSAGE"),
        ('{"role":"user","parts":[]}', "INVALID_MESSAGE"),
    ],
    ids=["json", "no-role", "parts-number", "no-id"],
)
def test_import_stream_rejects_bad_message(
    session: Any, data_dir: Path, object_key: str, raw: str, reason: str
) -> None:
    session.append_message(text_message("a"))
    before = file_state(data_dir, object_key)

    with pytest.raises(SessionsError) as caught:
        session.import_messages([ImportItem(raw, "a", 1_700_000_000_000)])

    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == reason
    assert file_state(data_dir, object_key) == before


def test_append_messages_item_error_names_the_reason(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("a"))
    before = file_state(data_dir, object_key)
    with pytest.raises(SessionsError) as caught:
        session.append_messages([text_message("b"), "{oops"])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "INVALID_JSON"
    assert file_state(data_dir, object_key) == before


def test_bad_message_on_a_fresh_object_writes_no_message(client: Any, data_dir: Path, object_key: str) -> None:
    session = client.object(object_key).session()
    with pytest.raises(SessionsError) as caught:
        session.append_message('{"id":"x","role":"user","parts":null}')
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message_rows(data_dir, object_key, None) == []


def test_upload_stream_without_header_is_invalid(stub: Any, object_key: str) -> None:
    frames = [pb.UploadMessageRequest(json_piece='{"id":"a","role":"user","parts":[]}')]
    with pytest.raises(grpc.RpcError) as caught:
        stub.UploadMessage(iter(frames))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_reason(caught.value) == "INVALID_STREAM"
    assert violated_field(caught.value) == "header"  # as generic tooling reads a bad field


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("ListSessions", "page_size"),
        ("ListCompactions", "page_size"),
        ("ListObjects", "page_size"),
        ("ExportObject negative", "lease_seconds"),
        ("ExportObject too long", "lease_seconds"),
    ],
)
def test_negative_sizes_and_a_lease_of_years_are_refused_not_taken_as_defaults(
    stub: Any, session: Any, object_key: str, name: str, field: str
) -> None:
    """A negative page size meant the default page, a negative lease the default one, and a
    lease of 68 years was taken. (A negative recent-history budget stays upstream's: the newest
    message alone.)"""
    session.append_message(text_message("m0"))
    calls = {
        "ListSessions": lambda: stub.ListSessions(pb.ListSessionsRequest(object_key=object_key, page_size=-1)),
        "ListCompactions": lambda: stub.ListCompactions(pb.ListCompactionsRequest(object_key=object_key, page_size=-5)),
        "ListObjects": lambda: stub.ListObjects(pb.ListObjectsRequest(page_size=-1)),
        "ExportObject negative": lambda: list(
            stub.ExportObject(pb.ExportObjectRequest(object_key=object_key, lock_for_move=True, lease_seconds=-10))
        ),
        "ExportObject too long": lambda: list(
            stub.ExportObject(
                pb.ExportObjectRequest(object_key=object_key, lock_for_move=True, lease_seconds=2_147_483_647)
            )
        ),
    }
    with pytest.raises(grpc.RpcError) as refused:
        calls[name]()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert field in (refused.value.details() or "")
    session.append_message(text_message("m1"))  # no move lock was taken


def test_a_bad_field_is_named_in_a_bad_request_detail_too(stub: Any, object_key: str) -> None:
    """Only an ErrorInfo was sent: generic gRPC tooling looks for google.rpc.BadRequest's field
    violations (AIP-193) to show which field was wrong."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    with pytest.raises(grpc.RpcError) as refused:
        stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json="{not json"))
    status = rpc_status.from_call(refused.value)  # type: ignore[arg-type]
    assert status is not None
    kinds = {detail.TypeName(): detail for detail in status.details}
    assert set(kinds) == {"google.rpc.ErrorInfo", "google.rpc.BadRequest"}
    bad = error_details_pb2.BadRequest()
    kinds["google.rpc.BadRequest"].Unpack(bad)
    (violation,) = bad.field_violations
    assert violation.field == "message_json" and violation.description


GOOD = '{"id":"g","role":"user","parts":[]}'


def _upload(header: Any, piece: str) -> Any:
    return iter([pb.UploadMessageRequest(header=header, json_piece=piece)])


def _import(object_key: str, *frames: Any) -> Any:
    return iter([pb.ImportMessagesRequest(object_key=object_key), *frames])


REFUSED_ON_A_NEW_OBJECT = {
    "AppendMessage": lambda stub, key: stub.AppendMessage(pb.AppendMessageRequest(object_key=key, message_json="{")),
    "AppendMessages": lambda stub, key: stub.AppendMessages(
        pb.AppendMessagesRequest(object_key=key, items=[pb.AppendItem(message_json=GOOD), pb.AppendItem()])
    ),
    "UploadMessage": lambda stub, key: stub.UploadMessage(
        _upload(pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_APPEND), "[")
    ),
    "ImportMessages whole": lambda stub, key: stub.ImportMessages(
        _import(key, pb.ImportMessagesRequest(messages=[pb.ImportedMessage(json="{")]))
    ),
    "ImportMessages ends in a piece": lambda stub, key: stub.ImportMessages(
        _import(key, pb.ImportMessagesRequest(json_piece=GOOD[:9], more_pieces=True))
    ),
}


@pytest.mark.parametrize("call", REFUSED_ON_A_NEW_OBJECT)
def test_a_write_refused_for_bad_input_creates_no_object(stub: Any, data_dir: Path, object_key: str, call: str) -> None:
    """A refused write changes nothing, and an object that was never written stays unwritten:
    no file, not listed. The import stream opened its object before its first message was
    checked, and left an empty store behind when that message was refused."""
    with pytest.raises(grpc.RpcError) as refused:
        REFUSED_ON_A_NEW_OBJECT[call](stub, object_key)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert not object_file(data_dir, object_key).exists()
    assert object_key not in listed_object_keys(stub)


def test_an_import_without_messages_and_an_update_of_nothing_create_no_object(
    stub: Any, data_dir: Path, object_key: str
) -> None:
    """Neither writes anything, so neither leaves a file: an import stream that only named its
    object, and an update of an id in an object never written (found=false, as upstream's null)."""
    assert stub.ImportMessages(_import(object_key)).imported_count == 0
    updated = stub.UpdateMessage(pb.UpdateMessageRequest(object_key=object_key, message_json=GOOD))
    assert not updated.found and not updated.changed
    assert not object_file(data_dir, object_key).exists()
    assert object_key not in listed_object_keys(stub)


def _items(*items: Any) -> Any:
    return pb.AppendMessagesRequest(items=[pb.AppendItem(message_json=GOOD), pb.AppendItem(message_json=GOOD), *items])


FIELD_PATHS = {
    "items[2].message_json": ("AppendMessages", lambda key: _items(pb.AppendItem(message_json="{"))),
    "items[2].parent_mode": ("AppendMessages", lambda key: _items(pb.AppendItem(message_json=GOOD, parent_mode=9))),
    "items[2].source": ("AppendMessages", lambda key: _items(pb.AppendItem(message_json=GOOD, source=9))),
    "items[2].parent_id": (
        "AppendMessages",
        lambda key: _items(pb.AppendItem(message_json=GOOD, parent_mode=pb.PARENT_MODE_ROOT, parent_id="p")),
    ),
    "items[0].message_json": ("AppendMessages", lambda key: pb.AppendMessagesRequest(items=[pb.AppendItem()])),
    "header.parent_mode": (
        "UploadMessage",
        lambda key: _upload(pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_APPEND, parent_mode=9), GOOD),
    ),
    "header.source": (
        "UploadMessage",
        lambda key: _upload(pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_UPSERT, source=9), GOOD),
    ),
    "json_piece": (
        "UploadMessage",
        lambda key: _upload(pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_UPDATE), "{"),
    ),
    "messages[1].json": (
        "ImportMessages",
        lambda key: _import(
            key, pb.ImportMessagesRequest(messages=[pb.ImportedMessage(json=GOOD), pb.ImportedMessage(json="7")])
        ),
    ),
    "messages[0].parent_id": (
        "ImportMessages",
        lambda key: _import(
            key, pb.ImportMessagesRequest(messages=[pb.ImportedMessage(json=GOOD, parent_id="p" * 20_000)])
        ),
    ),
}


@pytest.mark.parametrize("field", FIELD_PATHS)
def test_the_field_an_error_names_is_the_path_of_the_field_in_the_request(
    stub: Any, object_key: str, field: str
) -> None:
    """The BadRequest field violation (and ErrorInfo's `field`) is the offending field's path in
    the request, as AIP-193 has it: the batch item's index, the upload's header; generic tooling
    shows it beside the request."""
    method, request = FIELD_PATHS[field]
    built = request(object_key)
    if isinstance(built, pb.AppendMessagesRequest):
        built.object_key = object_key
    with pytest.raises(grpc.RpcError) as refused:
        getattr(stub, method)(built)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert violated_field(refused.value) == field
    assert SessionsError.from_rpc_error(refused.value).metadata.get("field") == field


LONG = "x" * 20_000  # past the 16 KiB bounds of ids, roles and parent ids
OVERSIZED_ITEMS = {
    "message id": pb.AppendItem(message_json=json.dumps({"id": LONG, "role": "user", "parts": []})),
    "role": pb.AppendItem(message_json=json.dumps({"id": "r", "role": LONG, "parts": []})),
    "parent id": pb.AppendItem(message_json=GOOD, parent_mode=pb.PARENT_MODE_ID, parent_id=LONG),
}


@pytest.mark.parametrize("what", OVERSIZED_ITEMS)
def test_a_size_refusal_in_a_batch_says_which_item_in_its_text(stub: Any, object_key: str, what: str) -> None:
    """A person reading the message, not the field violation, learns which item to shorten (the
    text said "the message id is 20000 bytes" for any item of the batch)."""
    request = _items(OVERSIZED_ITEMS[what])
    request.object_key = object_key
    with pytest.raises(grpc.RpcError) as refused:
        stub.AppendMessages(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert what in details and "items[2]" in details, details


@pytest.mark.parametrize(
    "header",
    [
        pb.UploadHeader(),
        pb.UploadHeader(operation=pb.UPLOAD_OPERATION_UPSERT, parent_mode=pb.PARENT_MODE_ROOT, parent_id="p"),
        pb.UploadHeader(operation=pb.UPLOAD_OPERATION_UPDATE, parent_mode=9),  # unused by an update, still checked
    ],
    ids=["no-operation", "root-with-parent", "update-unknown-parent-mode"],
)
def test_an_upload_with_a_bad_header_is_refused_before_its_message_arrives(
    stub: Any, data_dir: Path, object_key: str, header: Any
) -> None:
    """The header was checked once the whole message had arrived: a 500 MB upload that could
    never be written was received (and held against the server's assembly budget) first. Now
    what the client still sends is dropped, up to a bound (_client_stream), and it is answered."""
    header.object_key = object_key
    released = threading.Event()
    sent_all = threading.Event()

    def frames() -> Any:
        yield pb.UploadMessageRequest(header=header, json_piece='{"id":"a","role":"user",')
        released.wait(timeout=30)  # the rest of a large message, on its way (the refusal comes at 5 s)
        yield pb.UploadMessageRequest(json_piece='"parts":[]}')
        sent_all.set()

    try:
        with pytest.raises(grpc.RpcError) as refused:
            stub.UploadMessage(frames(), timeout=60)
        assert not sent_all.is_set(), "refused only once the whole message had come"
    finally:
        released.set()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert violated_field(refused.value).startswith("header.")
    assert not object_file(data_dir, object_key).exists()


@pytest.mark.parametrize(
    ("names", "field"),
    [({"object_key": ""}, "header.object_key"), ({"session_id": "s" * 1025}, "header.session_id")],
    ids=["empty-key", "long-session-id"],
)
def test_an_upload_header_s_names_are_refused_by_their_path_in_the_request(
    stub: Any, object_key: str, names: dict[str, str], field: str
) -> None:
    """They were named `object_key` and `session_id`, fields UploadMessageRequest does not have."""
    header = pb.UploadHeader(**{"object_key": object_key, **names}, operation=pb.UPLOAD_OPERATION_APPEND)
    request = pb.UploadMessageRequest(header=header, json_piece='{"id":"a","role":"user","parts":[]}')
    with pytest.raises(grpc.RpcError) as refused:
        stub.UploadMessage(iter([request]), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert violated_field(refused.value) == field
    assert (refused.value.details() or "").startswith(field)


def test_an_import_object_frame_naming_another_key_is_refused(stub: Any, data_dir: Path, object_key: str) -> None:
    """Later frames may leave object_key empty; one naming another key was ignored, and the
    file installed under the first frame's key (ImportMessages refuses the same mistake)."""
    from sessions_client._common import routing_metadata

    data = b"SQLite format 3\x00" + b"\x00" * 4_080
    frames = [
        pb.ImportObjectRequest(object_key=object_key, data=data[:2_000]),
        pb.ImportObjectRequest(object_key=object_key + "-other", data=data[2_000:]),
        pb.ImportObjectRequest(sha256=hashlib.sha256(data).hexdigest()),
    ]
    with pytest.raises(grpc.RpcError) as refused:
        stub.ImportObject(iter(frames), metadata=routing_metadata(object_key))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert error_reason(refused.value) == "INVALID_STREAM"
    assert violated_field(refused.value) == "object_key"
    assert not object_file(data_dir, object_key).exists()


def test_a_request_with_more_items_than_can_be_answered_is_refused_before_they_are_read(client: Any) -> None:
    """Counts alone refuse these, before any item is decoded: a 64 MiB AppendMessages of empty
    items held the event loop for about a minute before its refusal, GetMessages with millions
    of ids for seconds."""
    from sessions_server.domain.service import MAX_BATCH_ITEMS, MAX_DELETE_IDS, MAX_GET_IDS

    key = "counted"
    metadata = routing_metadata(key)
    stub = client._stub
    refusals = []
    for call in (
        lambda: stub.AppendMessages(
            pb.AppendMessagesRequest(object_key=key, items=[pb.AppendItem()] * (MAX_BATCH_ITEMS + 1)),
            metadata=metadata,
        ),
        lambda: list(
            stub.GetMessages(
                pb.GetMessagesRequest(object_key=key, message_ids=["m"] * (MAX_GET_IDS + 1)), metadata=metadata
            )
        ),
        lambda: stub.DeleteMessages(
            pb.DeleteMessagesRequest(object_key=key, message_ids=["m"] * (MAX_DELETE_IDS + 1)), metadata=metadata
        ),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        refusals.append((refused.value.code(), error_reason(refused.value)))
    assert refusals == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")] * 3
    assert client.object(key).list_sessions() == []  # nothing was written


def test_an_import_object_with_no_key_names_the_field(stub: Any) -> None:
    """An empty key was INVALID_STREAM with no field, where every other call names object_key."""
    with pytest.raises(grpc.RpcError) as refused:
        stub.ImportObject(iter([pb.ImportObjectRequest(data=b"x")]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert (error_reason(refused.value), violated_field(refused.value)) == ("INVALID_OBJECT_KEY", "object_key")


@pytest.mark.parametrize(
    ("object_key", "session_id", "reason", "field"),
    [
        ("", "", "INVALID_OBJECT_KEY", "object_key"),
        ("k\x00", "", "INVALID_OBJECT_KEY", "object_key"),
        ("k", "s" * 1_025, "INVALID_FIELD", "session_id"),
    ],
    ids=["empty-key", "nul-in-key", "long-session-id"],
)
def test_compact_refuses_bad_names_before_saying_no_summarizer_is_configured(
    stub: Any, object_key: str, session_id: str, reason: str, field: str
) -> None:
    """On a server without a summarizer, Compact answered FAILED_PRECONDITION NO_SUMMARIZER for
    a bad key or session id: the caller was sent to PlanCompaction, which refused the same name."""
    with pytest.raises(grpc.RpcError) as refused:
        stub.Compact(pb.CompactRequest(object_key=object_key, session_id=session_id))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert (error_reason(refused.value), violated_field(refused.value)) == (reason, field)


@pytest.mark.parametrize("field", ["threshold_tokens", "keep_recent_tokens"])
def test_a_negative_policy_value_is_named_by_its_path(stub: Any, object_key: str, field: str) -> None:
    policy = pb.CompactionPolicy(**{field: -1})
    with pytest.raises(grpc.RpcError) as refused:
        stub.SetCompactionPolicy(pb.SetCompactionPolicyRequest(object_key=object_key, policy=policy))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violated_field(refused.value) == f"policy.{field}"
    assert f"policy.{field} must not be negative, not -1" in (refused.value.details() or "")
