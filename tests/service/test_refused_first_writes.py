"""A write refused on a key never written leaves no object. Some refusals are found only as the
write runs, after the object's file was made: a batch whose results would not fit one response,
a message that would read back past its cap with its attachments put back inline. The empty
file stayed, listed by ListObjects, until the registry removed a file its open made when the
last call using it leaves with nothing committed."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server
from tests.service.support import files_under, listed_object_keys, object_file, text_message

ASSEMBLY_BYTES = 4 * 1024 * 1024  # the batch below (3.5 MB) is within it
PAYLOAD = random.Random(11).randbytes(30_000)  # 40,000 bytes in base64: 120 uses read back past the cap
INLINE = {
    "type": "file",
    "mediaType": "image/png",
    "url": "data:image/png;base64," + base64.b64encode(PAYLOAD).decode(),
}
POINTER = {"type": "file", "mediaType": "image/png", "url": "attachment:sha256:" + hashlib.sha256(PAYLOAD).hexdigest()}
TOO_LARGE_INLINE = json.dumps({"id": "m", "role": "user", "parts": [INLINE] + [POINTER] * 120})


def _results_past_the_bound() -> list[pb.AppendItem]:
    """Roots with long ids: their results would take about 3.5 MB, more than one response."""
    return [
        pb.AppendItem(
            message_json=json.dumps({"id": f"{index:04d}" + "i" * 16_000, "role": "user", "parts": []}),
            parent_mode=pb.PARENT_MODE_ROOT,
        )
        for index in range(220)
    ]


Write = Callable[[pb_grpc.SessionServiceStub, str], Any]

# Each refused as it runs, on an object not written before.
REFUSED_WRITES: dict[str, Write] = {
    "AppendMessages results past the response": lambda stub, key: stub.AppendMessages(
        pb.AppendMessagesRequest(object_key=key, items=_results_past_the_bound())
    ),
    "AppendMessage reading back too large": lambda stub, key: stub.AppendMessage(
        pb.AppendMessageRequest(object_key=key, message_json=TOO_LARGE_INLINE)
    ),
    "AppendMessages reading back too large": lambda stub, key: stub.AppendMessages(
        pb.AppendMessagesRequest(object_key=key, items=[pb.AppendItem(message_json=TOO_LARGE_INLINE)])
    ),
    "UpsertMessage reading back too large": lambda stub, key: stub.UpsertMessage(
        pb.UpsertMessageRequest(object_key=key, message_json=TOO_LARGE_INLINE)
    ),
    "ImportMessages reading back too large": lambda stub, key: stub.ImportMessages(
        iter([pb.ImportMessagesRequest(object_key=key, json_piece=TOO_LARGE_INLINE)])
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("refused") / "data", limits=Limits(max_assembly_bytes=ASSEMBLY_BYTES))
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def stub(server: LiveServer) -> Iterator[pb_grpc.SessionServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.SessionServiceStub(channel)


@pytest.mark.parametrize("write", list(REFUSED_WRITES))
def test_a_first_write_refused_as_it_runs_leaves_no_object(
    stub: pb_grpc.SessionServiceStub, server: LiveServer, write: str
) -> None:
    key = f"never-{uuid.uuid4().hex}"
    before = files_under(server.data_dir / "objects")

    with pytest.raises(grpc.RpcError) as refused:
        REFUSED_WRITES[write](stub, key)

    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "nothing was written" in (refused.value.details() or "")
    assert not object_file(server.data_dir, key).exists()
    assert files_under(server.data_dir / "objects") == before
    assert key not in listed_object_keys(stub)
    assert stub.GetObjectStats(pb.GetObjectStatsRequest(object_key=key)) == pb.GetObjectStatsResponse()


def test_the_key_takes_a_write_after_its_refused_first_one(
    stub: pb_grpc.SessionServiceStub, server: LiveServer
) -> None:
    key = f"later-{uuid.uuid4().hex}"
    with pytest.raises(grpc.RpcError):
        REFUSED_WRITES["AppendMessage reading back too large"](stub, key)

    stub.AppendMessage(pb.AppendMessageRequest(object_key=key, message_json=json.dumps(text_message("m1", "hello"))))

    assert object_file(server.data_dir, key).exists()
    assert key in listed_object_keys(stub)
    assert stub.GetObjectStats(pb.GetObjectStatsRequest(object_key=key)).message_rows == 1


def test_a_refused_write_to_a_written_object_leaves_it_as_it_was(
    stub: pb_grpc.SessionServiceStub, server: LiveServer
) -> None:
    key = f"written-{uuid.uuid4().hex}"
    stub.AppendMessage(pb.AppendMessageRequest(object_key=key, message_json=json.dumps(text_message("m1", "hello"))))

    for write in REFUSED_WRITES.values():
        with pytest.raises(grpc.RpcError):
            write(stub, key)

    assert object_file(server.data_dir, key).exists()
    assert key in listed_object_keys(stub)
    assert stub.GetObjectStats(pb.GetObjectStatsRequest(object_key=key)).message_rows == 1
