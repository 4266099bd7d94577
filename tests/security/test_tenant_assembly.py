"""With tokens, `--max-assembly-bytes` is shared fairly (transport/fair_share.py), through gRPC:
one tenant holding two large uploads open (their last piece never sent) refused every other
tenant's writes over 1 MiB, SERVER_BUSY, for as long as it kept them open."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.security.tenants import tenant_tokens
from tests.service.support import text_message

MIB = 1024 * 1024
BUDGET = 64 * MIB
UPLOAD = 31 * MIB
WAIT_SECONDS = 30.0  # a bound for a broken run, not a pace
HEAD = '{"id":"u","role":"user","parts":[{"type":"text","text":"'


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    tokens = tenant_tokens(tmp_path / "tokens.json", ("a", "b"))
    live = start_server(tmp_path / "data", tokens_file=tokens, limits=Limits(max_assembly_bytes=BUDGET))
    yield live
    live.stop()


def _metadata(tenant: str, key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {tenant}-secret"), ("x-object-key", key))


def _held_bytes(server: LiveServer) -> float:
    return float(server.running.metrics.registry.get_sample_value("sessions_assembly_bytes") or 0.0)


def test_one_tenants_open_uploads_leave_another_its_large_writes(server: LiveServer) -> None:
    release = threading.Event()

    def held_open(key: str) -> Iterator[pb.UploadMessageRequest]:
        header = pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_APPEND)
        yield pb.UploadMessageRequest(header=header, json_piece=HEAD)
        for _ in range(UPLOAD // MIB):
            yield pb.UploadMessageRequest(json_piece="x" * MIB)
        release.wait(WAIT_SECONDS)  # the last piece never comes while the test runs

    with (
        grpc.insecure_channel(server.address) as channel,
        ThreadPoolExecutor(max_workers=2) as pool,
    ):
        stub = pb_grpc.SessionServiceStub(channel)

        def upload(key: str) -> Future[pb.UploadMessageResponse]:
            return pool.submit(stub.UploadMessage, held_open(key), metadata=_metadata("a", key), timeout=WAIT_SECONDS)

        try:
            first = upload("tenant-a/first")
            assert wait_until(lambda: _held_bytes(server) >= UPLOAD, WAIT_SECONDS)
            second = upload("tenant-a/second")
            # Held whole (first come, first served), or refused at A's share.
            assert wait_until(lambda: _held_bytes(server) >= 2 * UPLOAD or second.done(), WAIT_SECONDS)

            key = "tenant-b/notes"
            large = json.dumps(text_message("m1", "y" * (2 * MIB)))  # past the small writes' pool
            written = stub.AppendMessage(
                pb.AppendMessageRequest(object_key=key, message_json=large), metadata=_metadata("b", key), timeout=30
            )
            assert written.inserted
            batch = [pb.AppendItem(message_json=json.dumps(text_message(f"b{i}", "z" * 100_000))) for i in range(30)]
            results = stub.AppendMessages(
                pb.AppendMessagesRequest(object_key=key, items=batch), metadata=_metadata("b", key), timeout=30
            ).results
            assert [result.inserted for result in results] == [True] * 30

            with pytest.raises(grpc.RpcError) as refused:
                second.result(timeout=WAIT_SECONDS)
            error = SessionsError.from_rpc_error(refused.value)
            assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER_BUSY")
            assert error.message.startswith("this token's calls hold ")
            assert "its share while other callers hold the rest" in error.message
            assert not first.done()  # A keeps what it took: nothing is taken back
        finally:
            release.set()
