"""Compressed requests are refused at once. gRPC core inflates one up to --max-request-bytes
before any handler sees it, on threads every call shares: an audit's 40 requests of 61 KB of
gzip each became 60 MiB, held 2.5 GiB and stalled other connections' calls for 30 s. The
clients never compress; a caller that does gets UNIMPLEMENTED, and nothing is written."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_client import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import start_server

MESSAGE = json.dumps({"id": "zipped", "role": "user", "parts": [{"type": "text", "text": "0" * 1_000_000}]})


def test_a_compressed_request_is_refused_at_once_and_writes_nothing(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", probe_listen="127.0.0.1:0")
    try:
        request = pb.AppendMessageRequest(object_key="k", message_json=MESSAGE)
        assert len(zlib.compress(request.SerializeToString())) < 5_000  # what such a caller sends
        with grpc.insecure_channel(server.address, compression=grpc.Compression.Gzip) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.SessionServiceStub(channel).AppendMessage(request, metadata=[("x-object-key", "k")], timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
            assert "Compression algorithm 'gzip' is disabled" in refused.value.details()  # type: ignore[attr-defined]
            with pytest.raises(grpc.RpcError) as health:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert health.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        assert server.running.probe_address is not None
        with grpc.insecure_channel(server.running.probe_address, compression=grpc.Compression.Gzip) as channel:
            with pytest.raises(grpc.RpcError) as probe:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert probe.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        with SessionsClient(server.address) as client:
            session = client.object("k").session()
            assert session.get_message("zipped") is None
            assert session.append_message(json.loads(MESSAGE)).inserted  # the same request uncompressed
    finally:
        server.stop()
