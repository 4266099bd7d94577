"""ListObjects leaves out files it cannot list (no key it can read: a stray file, say) and says
so in the log, once a minute a file: every listing logged every such file again, so a few stray
files and a dashboard listing objects filled the log (observability audit, session 49)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage import files, schema
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


def test_a_new_object_listed_while_its_file_is_made_is_not_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new object's file has its name before its key is recorded: a listing in that moment
    found a file with no key and warned of it as of a stray file, for each object made."""
    recorded = schema.record_new_object
    installed, release = threading.Event(), threading.Event()

    def held(conn: Any, object_key: str) -> None:
        installed.set()
        release.wait(timeout=30)
        recorded(conn, object_key)

    monkeypatch.setattr(schema, "record_new_object", held)
    data = tmp_path / "data"
    server = start_server(data)
    try:
        caplog.set_level(logging.WARNING, logger="sessions.objects")
        with SessionsClient(server.address) as client, ThreadPoolExecutor(max_workers=1) as pool:
            appended = pool.submit(client.object("new").session().append_message, text_message("m1"))
            assert installed.wait(timeout=30)
            assert object_path(data, "new").exists()  # the file is in place, its key not yet recorded
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.SessionServiceStub(channel)
                listed_while_made = list(stub.ListObjects(pb.ListObjectsRequest()).object_keys)
                release.set()
                appended.result(timeout=30)
                listed_after = list(stub.ListObjects(pb.ListObjectsRequest()).object_keys)
    finally:
        release.set()
        server.stop()
    assert (listed_while_made, listed_after) == ([], ["new"])
    assert [r.getMessage() for r in caplog.records if "not listed" in r.getMessage()] == []


def test_an_object_erased_while_it_is_listed_is_not_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing names the files, then reads each one's key: a file an erase (or a move's delete)
    removed in between has no key to read, and was warned of as unreadable, once for each object
    so met."""
    read_key = files.recorded_object_key
    data = tmp_path / "data"

    def erased_first(path: Path) -> str | None:
        if path == object_path(data, "erased"):
            path.unlink()  # what an erase does between the listing's two steps
        return read_key(path)

    monkeypatch.setattr(files, "recorded_object_key", erased_first)
    server = start_server(data)
    try:
        with SessionsClient(server.address) as client:
            for key in ("erased", "kept"):
                client.object(key).session().append_message(text_message("m1"))
        server.stop()  # closed: nothing holds the file that goes
        server = start_server(data)
        caplog.set_level(logging.WARNING, logger="sessions.objects")
        with grpc.insecure_channel(server.address) as channel:
            listed = list(pb_grpc.SessionServiceStub(channel).ListObjects(pb.ListObjectsRequest()).object_keys)
    finally:
        server.stop()
    assert listed == ["kept"]
    assert [r.getMessage() for r in caplog.records if "not listed" in r.getMessage()] == []
