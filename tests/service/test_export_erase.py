"""An erase ends the exports of its object under way: an import audit saw an export begun before
an erase go on sending the whole erased object after the erase returned (206 MB, a valid
digest), a copy of data the caller had asked to delete for good."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_client.admin import erase_object
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage import files
from tests.conftest import LiveServer, start_server
from tests.service.support import exported, text_message

KEY = "erased-while-exported"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server of the test's own, stopped at its end: the exports it cut and the erase it
    failed leave nothing in the shared server for later tests."""
    own = start_server(tmp_path / "data")
    yield own
    own.stop()


def test_an_erase_ends_an_export_under_way(server: LiveServer) -> None:
    with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
        session = client.object(KEY).session()
        _large_object(client, KEY)
        frames, received, size = _export_begun(pb_grpc.SessionServiceStub(channel), KEY)
        assert erase_object(client, KEY)
        with pytest.raises(grpc.RpcError) as ended:
            for frame in frames:
                received += len(frame.data)
                assert not frame.sha256, "the whole erased object was sent"
        assert ended.value.code() == grpc.StatusCode.NOT_FOUND
        assert "erased while it was being exported" in (ended.value.details() or "")
        assert received < size
        assert session.get_history() == []


def _large_object(client: SessionsClient, key: str) -> None:
    session = client.object(key).session()
    for index in range(40):  # about 40 MB: frames of 3 MiB, more than the transport buffers
        session.append_message(text_message(f"m{index}", f"{index} " + "x" * 1_000_000))


def _export_begun(stub: pb_grpc.SessionServiceStub, key: str) -> tuple[Iterator[pb.ExportObjectResponse], int, int]:
    """An export of `key` under way: its frames to come, the bytes received and the file's size."""
    frames = stub.ExportObject(pb.ExportObjectRequest(object_key=key), metadata=routing_metadata(key))
    first = next(frames)
    assert first.size_bytes > 30_000_000 and first.data
    return frames, len(first.data), first.size_bytes


def test_an_erase_that_fails_leaves_the_exports_under_way(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The erase ended the exports before it removed the files: one that then failed (the disk)
    had ended them all the same, though the object stayed (a review); and it answered INTERNAL."""

    def failing_removal(*args: Any, **kwargs: Any) -> bool:
        raise OSError(5, "Input/output error")

    with SessionsClient(server.address, retry=None) as client, grpc.insecure_channel(server.address) as channel:
        _large_object(client, KEY)
        frames, received, _ = _export_begun(pb_grpc.SessionServiceStub(channel), KEY)
        monkeypatch.setattr(files, "remove_object_files", failing_removal)
        with pytest.raises(SessionsError) as failed:
            erase_object(client, KEY)
        # Not INTERNAL ("internal error: OSError", as it was): the disk, said so.
        assert (failed.value.code, failed.value.reason) == (grpc.StatusCode.UNAVAILABLE, "STORAGE_FAILURE")
        assert "could not be removed (" in failed.value.message
        monkeypatch.undo()
        digest = ""
        for frame in frames:  # to its end
            received += len(frame.data)
            digest = frame.sha256 or digest
        assert digest and received > 30_000_000
        assert len(client.object(KEY).session().get_history()) == 40  # still there


def test_dropping_a_moves_held_copy_ends_its_exports(server: LiveServer) -> None:
    """An erase naming a move's hold (the move failed) removes the copy the move brought, as an
    erase does, and ended none of its exports under way: they sent the whole dropped copy."""
    key = "held-while-exported"
    with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        _large_object(client, "held-source")
        data = b"".join(frame.data for frame in exported(stub, "held-source"))
        imports = [
            pb.ImportObjectRequest(object_key=key, hold_for_move=True, data=data),
            pb.ImportObjectRequest(sha256=hashlib.sha256(data).hexdigest()),
        ]
        hold = stub.ImportObject(iter(imports), metadata=routing_metadata(key)).move_id
        frames, received, _ = _export_begun(stub, key)

        dropped = stub.DeleteObject(
            pb.DeleteObjectRequest(object_key=key, erase=True, move_id=hold), metadata=routing_metadata(key)
        )
        assert dropped.deleted
        with pytest.raises(grpc.RpcError) as ended:
            for frame in frames:
                received += len(frame.data)
                assert not frame.sha256, "the whole dropped copy was sent"
        assert ended.value.code() == grpc.StatusCode.NOT_FOUND
        assert received < len(data)
