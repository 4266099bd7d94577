"""The access log (`sessions.access`, one DEBUG line a call) and the log of refusals by the token
check (`sessions.auth`, WARNING, rate-limited), against a server with tokens: neither ever holds
a token. Before, neither existed: a refused token left no trace at any level."""

from __future__ import annotations

import hashlib
import json
import logging
import queue
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.transport.auth import hash_token
from sessions_server.transport.metrics import RequestIdFilter
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.service.support import text_message

WRITER = "tok-writer-9c1f4e7a"
READER = "tok-reader-5b2d8e01"
STRANGER = "tok-stranger-77aa31c"
KEY = "tenant-a/audited"


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[LiveServer]:
    tokens = tmp_path / "tokens.json"
    grants = [
        {"name": "writer", "sha256": hash_token(WRITER), "prefixes": ["tenant-a/"], "access": "write"},
        {"name": "reader", "sha256": hash_token(READER), "prefixes": ["tenant-a/"], "access": "read"},
    ]
    tokens.write_text(json.dumps({"tokens": grants}))
    server = start_server(tmp_path / "data", tokens_file=tokens)
    yield server
    server.stop()


def _access(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sessions.access"]


def test_each_call_is_logged_once_and_refusals_are_warned_of_without_the_token(
    auth_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything, gRPC's own lines too: none may hold a token
    caplog.handler.addFilter(RequestIdFilter())  # as the server's log handler has it
    with SessionsClient(auth_server.address, token=WRITER, retry=None) as writer:
        writer.object(KEY).session().append_message(text_message("m1"))
    with SessionsClient(auth_server.address, token=STRANGER, retry=None) as stranger:
        for _ in range(3):
            with pytest.raises(SessionsError) as unknown:
                stranger.object(KEY).session().get_message("m1")
            assert unknown.value.code == grpc.StatusCode.UNAUTHENTICATED
    with SessionsClient(auth_server.address, token=READER, retry=None) as reader:
        with pytest.raises(SessionsError) as denied:
            reader.object(KEY).session().append_message(text_message("m2"))
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
    with grpc.insecure_channel(auth_server.address) as channel:
        metadata = (*routing_metadata(KEY, WRITER), ("x-request-id", "trace-41"))
        leaf = list(
            pb_grpc.SessionServiceStub(channel).GetLatestLeaf(
                pb.GetLatestLeafRequest(object_key=KEY), metadata=metadata
            )
        )
        assert leaf
    # A refused call is logged as its handler unwinds, which can follow the status its client saw.
    assert wait_until(lambda: len(_access(caplog)) >= 6, timeout=10), [r.getMessage() for r in _access(caplog)]

    digest = hashlib.sha256(KEY.encode()).hexdigest()[:16]
    lines = [r.getMessage() for r in _access(caplog)]
    assert all(r.levelno == logging.DEBUG for r in _access(caplog))
    assert Counter(line.split(" ms ")[0].rsplit(" ", 1)[0] for line in lines) == {
        "SessionService/AppendMessage OK reason=-": 1,
        "SessionService/GetMessage UNAUTHENTICATED reason=UNAUTHENTICATED": 3,
        "SessionService/AppendMessage PERMISSION_DENIED reason=PERMISSION_DENIED": 1,
        "SessionService/GetLatestLeaf OK reason=-": 1,
    }, lines
    assert all(f" object={digest} peer=ipv4:127.0.0.1:" in line for line in lines), lines
    (traced,) = [r for r in _access(caplog) if r.getMessage().startswith("SessionService/GetLatestLeaf")]
    assert getattr(traced, "request_id", None) == "trace-41"

    warned = [r.getMessage() for r in caplog.records if r.name == "sessions.auth" and r.levelno == logging.WARNING]
    assert len(warned) == 2, warned  # the unknown token's three refusals: one line this minute
    assert warned[0].startswith("refused SessionService/GetMessage from ipv4:127.0.0.1: UNAUTHENTICATED ")
    assert "unknown bearer token" in warned[0]
    assert warned[1].startswith("refused SessionService/AppendMessage from ipv4:127.0.0.1: PERMISSION_DENIED ")
    assert "'reader'" in warned[1]  # the grant's name, which is no secret

    for record in caplog.records:
        text = caplog.handler.format(record) + repr(record.args) + record.getMessage()
        for token in (WRITER, READER, STRANGER):
            assert token not in text, (record.name, text)
            assert hash_token(token) not in text


def test_without_debug_the_access_log_says_nothing(auth_server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with SessionsClient(auth_server.address, token=WRITER) as writer:
        writer.object(KEY).session().append_message(text_message("m1"))
        assert writer.object(KEY).session().get_message("m1") == text_message("m1")
    assert _access(caplog) == []


def test_a_callers_request_id_holds_only_id_characters_and_a_cut_off_call_keeps_its_peer(
    auth_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A request id with spaces and brackets wrote what read as another call into a text log
    line; a call whose deadline passed was logged with an empty peer (gRPC no longer says once
    the call has ended) and counted CANCELLED (observability audit, session 49)."""
    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(RequestIdFilter())
    forged = "x]: SessionService/DeleteObject OK reason=- 0.1 ms object=- peer=ipv4:10.9.9.9:1 ["
    release: queue.Queue[None] = queue.Queue()
    with grpc.insecure_channel(auth_server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        metadata = (*routing_metadata(KEY, WRITER), ("x-request-id", forged))
        assert list(stub.GetLatestLeaf(pb.GetLatestLeafRequest(object_key=KEY), metadata=metadata)) is not None

        def held_open() -> Iterator[pb.UploadMessageRequest]:
            header = pb.UploadHeader(object_key=KEY, operation=pb.UPLOAD_OPERATION_APPEND)
            yield pb.UploadMessageRequest(header=header, json_piece='{"id":')
            release.get()

        with pytest.raises(grpc.RpcError) as late:
            stub.UploadMessage(held_open(), metadata=routing_metadata(KEY, WRITER), timeout=0.5)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        release.put(None)
    assert wait_until(lambda: len(_access(caplog)) >= 2, timeout=10), [r.getMessage() for r in _access(caplog)]
    (leaf,) = [r for r in _access(caplog) if r.getMessage().startswith("SessionService/GetLatestLeaf")]
    assert (
        getattr(leaf, "request_id", None)
        == "x_:_SessionService/DeleteObject_OK_reason=-_0.1_ms_object=-_peer=ipv4:10.9.9.9:1__"
    )
    (upload,) = [r.getMessage() for r in _access(caplog) if r.getMessage().startswith("SessionService/UploadMessage")]
    assert upload.startswith("SessionService/UploadMessage DEADLINE_EXCEEDED reason=-"), upload
    assert " peer=ipv4:127.0.0.1:" in upload, upload
