"""A call that fails (cancelled, past its deadline, refused) leaves nothing for the garbage
collector: the metering wrapper kept the failure in a local of its frame, and the failure's
traceback holds that frame, a cycle that kept every frame of the call, with the request and the
message in its prepared forms, until a full collection. The server makes those rare (it raises
the young generation's threshold and freezes what startup built): 16 cancelled 10 MB uploads
held 379 MiB until one came (deadlines and cancellation audit, session 49).

Automatic collection is off while a call runs here, so that its cycles, if any, are still there
to be found by a collection that saves what it finds."""

from __future__ import annotations

import gc
import json
import queue
import types
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import start_server
from tests.deploy.support import free_port
from tests.reliability.support import routing, wait_until
from tests.service.support import text_message

KEY = "failed-calls"
SERVER_CODE = "/sessions_server/"


def _finished(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("sessions_rpcs_total{") and 'service="sessions.v1.SessionService"' in line
    )


def _server_frames_in_cycles() -> list[str]:
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        frames = [
            f"{found.f_code.co_filename.rsplit(SERVER_CODE, 1)[-1]}:{found.f_code.co_name}"
            for found in gc.garbage
            if isinstance(found, types.FrameType) and SERVER_CODE in found.f_code.co_filename
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return frames


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_cancelled_timed_out_and_refused_calls_leave_no_cycles(tmp_path: Path, collector_off: None) -> None:
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    release: queue.Queue[None] = queue.Queue()

    def held_open(message_id: str) -> Iterator[pb.UploadMessageRequest]:
        header = pb.UploadHeader(object_key=KEY, operation=pb.UPLOAD_OPERATION_APPEND)
        yield pb.UploadMessageRequest(header=header, json_piece=json.dumps(text_message(message_id, "x" * 4096)))
        release.get()

    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            stub.AppendMessage(
                pb.AppendMessageRequest(object_key=KEY, message_json=json.dumps(text_message("first"))),
                metadata=routing(KEY),
            )
            assert wait_until(lambda: _finished(port) == 1, timeout=10)
            assert _server_frames_in_cycles() == []  # a call that succeeds leaves none either

            cancelled = stub.UploadMessage.future(held_open("cancelled"), metadata=routing(KEY))
            assert wait_until(lambda: _finished(port) == 1 and not cancelled.done(), timeout=10)
            cancelled.cancel()
            with pytest.raises(grpc.RpcError) as late:
                stub.UploadMessage(held_open("late"), metadata=routing(KEY), timeout=0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            with pytest.raises(grpc.RpcError) as refused:
                stub.AppendMessage(
                    pb.AppendMessageRequest(object_key=KEY, message_json="{not json"), metadata=routing(KEY)
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert wait_until(lambda: _finished(port) == 4, timeout=10)
            assert _server_frames_in_cycles() == []
    finally:
        release.put(None)
        release.put(None)
        server.stop()


def test_a_stream_refused_after_it_sent_frames_leaves_no_cycles(tmp_path: Path, collector_off: None) -> None:
    """An export an erase cut after its first frames ended with gRPC's abort, which gRPC keeps
    with the call while the abort's traceback holds the call's frames (the export's own, its
    copy of the file and the frame in hand): a cycle, until a full collection. A stream's
    refusal is its status, set as the handler returns, now."""
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            for index in range(12):  # about 12 MB: frames of 3 MiB, more than the transport buffers
                message = json.dumps(text_message(f"m{index}", "x" * 1_000_000))
                stub.AppendMessage(pb.AppendMessageRequest(object_key=KEY, message_json=message), metadata=routing(KEY))
            gc.collect()
            frames = stub.ExportObject(pb.ExportObjectRequest(object_key=KEY), metadata=routing(KEY))
            assert next(frames).data
            stub.DeleteObject(pb.DeleteObjectRequest(object_key=KEY, erase=True), metadata=routing(KEY))
            with pytest.raises(grpc.RpcError) as ended:
                for _ in frames:
                    pass
            assert ended.value.code() == grpc.StatusCode.NOT_FOUND  # the refusal, still said
            assert "erased while it was being exported" in (ended.value.details() or "")
            assert wait_until(lambda: _finished(port) == 14, timeout=10)
            assert _server_frames_in_cycles() == []
    finally:
        server.stop()
