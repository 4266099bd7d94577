"""ListObjects leaves out files it cannot list (no key it can read: a stray file, say) and says
so in the log, once a minute a file: every listing logged every such file again, so a few stray
files and a dashboard listing objects filled the log (observability audit, session 49)."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.paths import object_path
from tests.conftest import start_server
from tests.service.support import text_message


def test_each_file_left_out_of_listings_is_warned_of_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    try:
        with SessionsClient(server.address) as client:
            client.object("listed").session().append_message(text_message("m1"))
        strays = [object_path(data, "junk"), object_path(data, "empty")]
        for stray, content in zip(strays, (b"not a database", b""), strict=True):
            stray.parent.mkdir(parents=True, exist_ok=True)
            stray.write_bytes(content)
        caplog.set_level(logging.WARNING, logger="sessions.objects")
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            for _ in range(5):
                assert list(stub.ListObjects(pb.ListObjectsRequest()).object_keys) == ["listed"]
    finally:
        server.stop()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "not listed" in r.getMessage()]
    assert sorted(line.split(" ", 1)[0] for line in warned) == sorted(map(str, strays)), warned
    assert all(line.endswith("records no object key it can read: not listed") for line in warned), warned
