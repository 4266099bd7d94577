"""A reload (SIGHUP) that narrows or removes a token ends the reads it already had open: each
response of a server stream is sent only while the token still grants the call. A read opened
before the reload went on to its end, and its later windows, read from the object's current
state, showed what was written after the token had lost the key."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.transport.auth import hash_token
from tests.conftest import LiveServer, start_server
from tests.security.test_auth_tls import _reload_tokens
from tests.service.support import text_message

KEY = "tenant-a/history"
MESSAGES = 2000
# 4 KB a response: the 64 KiB window of a client that reads nothing (and probes no bandwidth)
# takes a few dozen of them, far from the read's end.
FILLER = "common " + "h" * 4000
SECRET = "SECRET written after the reader lost the key"
CALL_SECONDS = 30  # a bound for a broken run, not a pace

WRITER = {"name": "writer", "sha256": hash_token("w-secret"), "prefixes": [""], "access": "write"}
READER = {"name": "reader", "sha256": hash_token("r-secret"), "prefixes": ["tenant-a/"], "access": "write"}
NARROWED = {**READER, "prefixes": ["tenant-a/keep/"]}
READ_ONLY = {**READER, "access": "read"}


def _metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"), ("x-object-key", KEY))


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [WRITER, READER]}))
    return path


@pytest.fixture
def server(tmp_path: Path, tokens_file: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "data", tokens_file=tokens_file)
    try:
        with grpc.insecure_channel(live.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            items = [pb.AppendItem(message_json=json.dumps(text_message(f"m{i}", FILLER))) for i in range(MESSAGES)]
            stub.AppendMessages(
                pb.AppendMessagesRequest(object_key=KEY, items=items), metadata=_metadata("w-secret"), timeout=60
            )
        yield live
    finally:
        live.stop()


Open = Callable[[pb_grpc.SessionServiceStub, tuple[tuple[str, str], ...]], Any]

READS: dict[str, Open] = {
    "StreamHistory": lambda stub, metadata: stub.StreamHistory(
        pb.StreamHistoryRequest(object_key=KEY, max_messages_per_response=1), metadata=metadata, timeout=CALL_SECONDS
    ),
    "GetRecentHistory": lambda stub, metadata: stub.GetRecentHistory(
        pb.GetRecentHistoryRequest(object_key=KEY, max_content_bytes=1 << 30, max_messages_per_response=1),
        metadata=metadata,
        timeout=CALL_SECONDS,
    ),
    "GetMessages": lambda stub, metadata: stub.GetMessages(
        pb.GetMessagesRequest(
            object_key=KEY, message_ids=[f"m{i}" for i in range(MESSAGES)], max_messages_per_response=1
        ),
        metadata=metadata,
        timeout=CALL_SECONDS,
    ),
    "SearchMessages": lambda stub, metadata: stub.SearchMessages(
        pb.SearchMessagesRequest(object_key=KEY, query="common", limit=MESSAGES, max_hits_per_response=1),
        metadata=metadata,
        timeout=CALL_SECONDS,
    ),
}


@pytest.mark.parametrize(
    ("read", "reloaded", "code"),
    [
        ("StreamHistory", [WRITER, NARROWED], grpc.StatusCode.PERMISSION_DENIED),
        ("StreamHistory", [WRITER], grpc.StatusCode.UNAUTHENTICATED),
        ("GetRecentHistory", [WRITER, NARROWED], grpc.StatusCode.PERMISSION_DENIED),
        ("GetMessages", [WRITER], grpc.StatusCode.UNAUTHENTICATED),
        ("SearchMessages", [WRITER, NARROWED], grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_an_open_read_of_a_revoked_token_ends_before_its_later_frames(
    server: LiveServer, tokens_file: Path, read: str, reloaded: list[dict[str, Any]], code: grpc.StatusCode
) -> None:
    # No bandwidth probe: the reader's window stays gRPC's initial 64 KiB while it reads nothing.
    options = [("grpc.http2.bdp_probe", 0)]
    with (
        grpc.insecure_channel(server.address, options=options) as reader_channel,
        grpc.insecure_channel(server.address) as writer_channel,
    ):
        reader = pb_grpc.SessionServiceStub(reader_channel)
        writer = pb_grpc.SessionServiceStub(writer_channel)
        responses = READS[read](reader, _metadata("r-secret"))
        received = [next(responses)]  # open, and then left unread

        tokens_file.write_text(json.dumps({"tokens": reloaded}))
        _reload_tokens(server)
        # Rewritten after the reload: a message the open read has not reached yet, and a new one.
        writer.UpdateMessage(
            pb.UpdateMessageRequest(object_key=KEY, message_json=json.dumps(text_message("m1990", f"common {SECRET}"))),
            metadata=_metadata("w-secret"),
            timeout=CALL_SECONDS,
        )
        with pytest.raises(grpc.RpcError) as refused:
            READS[read](reader, _metadata("r-secret")).__next__()
        assert refused.value.code() == code  # type: ignore[attr-defined]  # what a new call gets

        with pytest.raises(grpc.RpcError) as ended:
            for response in responses:
                received.append(response)
        assert ended.value.code() == code  # type: ignore[attr-defined]
        assert len(received) < MESSAGES // 4  # what gRPC had taken before the reload, no more
        assert all(SECRET not in str(response) for response in received)


def test_an_export_of_a_token_that_may_no_longer_write_ends(server: LiveServer, tokens_file: Path) -> None:
    """An export needs a write grant: one opened before the reload that took it away ends too."""
    options = [("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        frames = stub.ExportObject(
            pb.ExportObjectRequest(object_key=KEY), metadata=_metadata("r-secret"), timeout=CALL_SECONDS
        )
        received = [next(frames)]
        tokens_file.write_text(json.dumps({"tokens": [WRITER, READ_ONLY]}))
        _reload_tokens(server)
        with pytest.raises(grpc.RpcError) as ended:
            for frame in frames:
                received.append(frame)
        assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        assert sum(len(frame.data) for frame in received) < received[0].size_bytes


def test_an_export_locking_for_a_move_ends_when_its_token_no_longer_grants_every_key(
    server: LiveServer, tokens_file: Path
) -> None:
    """A move's export needs a token granting every key: one whose grant a reload narrowed to a
    tenant's prefix, still allowed to write this key, no longer holds the object for a move."""
    options = [("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        frames = stub.ExportObject(
            pb.ExportObjectRequest(object_key=KEY, lock_for_move=True),
            metadata=_metadata("w-secret"),
            timeout=CALL_SECONDS,
        )
        received = [next(frames)]
        tokens_file.write_text(json.dumps({"tokens": [{**WRITER, "prefixes": ["tenant-a/"]}, READER]}))
        _reload_tokens(server)
        with pytest.raises(grpc.RpcError) as ended:
            for frame in frames:
                received.append(frame)
        assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        assert "needs a token granting every object key" in ended.value.details()  # type: ignore[attr-defined]
        assert sum(len(frame.data) for frame in received) < received[0].size_bytes
