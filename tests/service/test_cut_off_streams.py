"""Client streams that end because their call ended, not because their client finished sending.

gRPC ends a client stream's frames alike when its client half-closes it and when the call ends
under it (cancelled, deadline passed, the server stopping), and cancels the handler only later.
The server took both for the end of the input: an UploadMessage whose JSON had all arrived was
written although its client had cancelled it (counted OK), and one cut short was counted
INVALID_ARGUMENT/INVALID_JSON, the caller's fault, though the caller had given up. A deadline
that ended any call was counted CANCELLED. Each case here waits for the server to count the
call before it looks at what was stored (the observability audit of the forty-ninth session)."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import LiveServer, start_server
from tests.deploy.support import free_port
from tests.reliability.support import routing, wait_until
from tests.service.support import text_message

KEY = "cut-off"
SERVICE = 'service="sessions.v1.SessionService"'


@pytest.fixture
def metered(tmp_path: Path) -> Iterator[tuple[LiveServer, int]]:
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    yield server, port
    server.stop()


def _value(port: int, series: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _count(port: int, code: str, method: str = "UploadMessage", reason: str = "") -> float:
    return _value(port, f'sessions_rpcs_total{{code="{code}",method="{method}",reason="{reason}",{SERVICE}}}')


def _held_open(message_json: str, release: queue.Queue[None]) -> Iterator[pb.UploadMessageRequest]:
    """An upload of `message_json` whose stream stays open (never half-closed) until released."""
    header = pb.UploadHeader(object_key=KEY, session_id="s", operation=pb.UPLOAD_OPERATION_APPEND)
    yield pb.UploadMessageRequest(header=header, json_piece=message_json)
    release.get()


def _stored(stub: pb_grpc.SessionServiceStub, message_id: str) -> bool:
    request = pb.GetMessageRequest(object_key=KEY, session_id="s", message_id=message_id)
    return bool(list(stub.GetMessage(request, metadata=routing(KEY))))


@pytest.mark.parametrize("whole", [True, False], ids=["whole-json", "json-cut-short"])
def test_an_upload_its_client_cancels_is_not_written_and_counted_cancelled(
    metered: tuple[LiveServer, int], whole: bool
) -> None:
    server, port = metered
    text = json.dumps(text_message("cancelled"))
    release: queue.Queue[None] = queue.Queue()
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        future = stub.UploadMessage.future(
            _held_open(text if whole else text[: len(text) // 2], release), metadata=routing(KEY)
        )
        # The piece has arrived once the server holds it against the assembly budget.
        assert wait_until(lambda: _value(port, "sessions_assembly_bytes") > 0, timeout=10)
        future.cancel()
        try:
            assert wait_until(lambda: _count(port, "CANCELLED") == 1, timeout=10), (
                _count(port, "OK"),
                _count(port, "INVALID_ARGUMENT", reason="INVALID_JSON"),
            )
            assert _count(port, "OK") == 0
            assert _count(port, "INVALID_ARGUMENT", reason="INVALID_JSON") == 0
            assert not _stored(stub, "cancelled")
        finally:
            release.put(None)


def test_an_upload_whose_deadline_passes_is_not_written_and_counted_deadline_exceeded(
    metered: tuple[LiveServer, int],
) -> None:
    server, port = metered
    release: queue.Queue[None] = queue.Queue()
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        try:
            with pytest.raises(grpc.RpcError) as failed:
                stub.UploadMessage(
                    _held_open(json.dumps(text_message("late")), release), metadata=routing(KEY), timeout=0.5
                )
            assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert wait_until(lambda: _count(port, "DEADLINE_EXCEEDED") == 1, timeout=10), _count(port, "CANCELLED")
            assert _count(port, "OK") == _count(port, "CANCELLED") == 0
            assert not _stored(stub, "late")
        finally:
            release.put(None)


def test_an_upload_its_client_finishes_is_written_as_before(metered: tuple[LiveServer, int]) -> None:
    server, port = metered
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        header = pb.UploadHeader(object_key=KEY, session_id="s", operation=pb.UPLOAD_OPERATION_APPEND)
        text = json.dumps(text_message("finished"))
        pieces = [text[:10], text[10:]]
        requests = [pb.UploadMessageRequest(header=header, json_piece=pieces[0])]
        requests.append(pb.UploadMessageRequest(json_piece=pieces[1]))
        response = stub.UploadMessage(iter(requests), metadata=routing(KEY))
        assert response.inserted
        assert _stored(stub, "finished")
        # An empty stream is still the caller's mistake, answered as such.
        with pytest.raises(grpc.RpcError) as empty:
            stub.UploadMessage(iter([]), metadata=routing(KEY))
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert wait_until(lambda: _count(port, "OK") == 1, timeout=10)
