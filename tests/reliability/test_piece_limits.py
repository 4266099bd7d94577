"""Messages sent in pieces (UploadMessage, ImportMessages) are held while they arrive, within
bounds: a `source=client` message is refused at the piece that passes its limit, not after the
whole stream, and all calls together hold at most --max-assembly-bytes, so a stream of pieces
cannot exhaust the server's memory; whole messages of unary writes count too while they are
written. Each refusal leaves the server serving and nothing written."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.errors import LimitExceeded
from sessions_server.transport.pieces import AssemblyBudget, Pieces
from tests.deploy.support import free_port
from tests.reliability.support import Server, routing, wait_until
from tests.service.support import error_reason

MIB = 1024 * 1024
PIECE = "x" * (256 * 1024)  # ASCII: characters are bytes
HEAD = '{"id":"big","role":"user","parts":[{"type":"text","text":"'
TAIL = '"}]}'


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    running = Server(
        tmp_path / "data",
        "--max-client-message-bytes",
        str(2 * MIB),
        "--max-assembly-bytes",
        str(8 * MIB),
        "--metrics-listen",
        f"127.0.0.1:{port}",
    ).start()
    running.metrics_port = port  # type: ignore[attr-defined]
    yield running
    running.stop()


class Upload:
    """An UploadMessage stream of `total` bytes of text; counts the pieces the client handed over."""

    def __init__(self, key: str, total: int, source: pb.Source.ValueType, hold: threading.Event | None = None) -> None:
        self.key, self.total, self.source, self.hold = key, total, source, hold
        self.pieces_sent = 0

    def frames(self) -> Iterator[pb.UploadMessageRequest]:
        header = pb.UploadHeader(object_key=self.key, operation=pb.UPLOAD_OPERATION_APPEND, source=self.source)
        yield pb.UploadMessageRequest(header=header, json_piece=HEAD)
        for _ in range(self.total // len(PIECE)):
            yield pb.UploadMessageRequest(json_piece=PIECE)
            self.pieces_sent += 1
        if self.hold is not None:
            self.hold.wait()  # the last piece waits: the message stays incomplete on the server
        yield pb.UploadMessageRequest(json_piece=TAIL)

    def send(self, stub: pb_grpc.SessionServiceStub) -> pb.UploadMessageResponse:
        return stub.UploadMessage(self.frames(), metadata=routing(self.key), timeout=60)


def _stub(server: Server) -> pb_grpc.SessionServiceStub:
    return pb_grpc.SessionServiceStub(grpc.insecure_channel(server.address))


def _stored_ids(stub: pb_grpc.SessionServiceStub, key: str) -> list[str]:
    request = pb.StreamHistoryRequest(object_key=key)
    responses = stub.StreamHistory(request, metadata=routing(key))
    return [f.info.id for r in responses for f in r.frames or [r.frame] if f.HasField("info")]  # heads of messages


def _held_bytes(server: Server, gauge: str = "sessions_assembly_bytes") -> float:
    port = server.metrics_port  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        text = page.read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(gauge + " ")))


def _refused_early(stub: pb_grpc.SessionServiceStub, upload: Upload, limit: str) -> None:
    """The upload fails naming `limit` while its stream goes on: the client handed over a
    fraction of it (what flow control let through), not all of it, as when the server read to
    the end before checking. Nothing is stored."""
    with pytest.raises(grpc.RpcError) as refused:
        upload.send(stub)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert limit in (refused.value.details() or "")
    assert error_reason(refused.value) == "LIMIT_EXCEEDED"  # for good: retrying cannot help
    assert upload.pieces_sent * len(PIECE) < upload.total // 4
    assert _stored_ids(stub, upload.key) == []


@contextlib.contextmanager
def _upload_held(server: Server, stub: pb_grpc.SessionServiceStub, size: int) -> Iterator[None]:
    """An upload of `size` bytes whose last piece waits for the block to end: meanwhile the
    server holds its bytes. After the block the upload is stored and the budget is free again."""
    hold = threading.Event()
    upload = Upload("first", size, pb.SOURCE_SERVER, hold)
    outcome: list[pb.UploadMessageResponse | grpc.RpcError] = []

    def send() -> None:
        try:
            outcome.append(upload.send(stub))
        except grpc.RpcError as error:
            outcome.append(error)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        assert wait_until(lambda: _held_bytes(server) >= size, timeout=30), "the upload never arrived"
        yield
    finally:
        hold.set()
        sender.join()
    assert isinstance(outcome[0], pb.UploadMessageResponse) and outcome[0].inserted
    assert wait_until(lambda: _held_bytes(server) == 0, timeout=10)


def test_a_client_message_is_refused_at_the_piece_past_its_limit(server: Server) -> None:
    _refused_early(_stub(server), Upload("client", 256 * MIB, pb.SOURCE_CLIENT), "max_client_message_bytes")


def test_a_message_larger_than_the_assembly_budget_is_refused_and_a_smaller_one_stored(server: Server) -> None:
    stub = _stub(server)
    _refused_early(stub, Upload("server", 256 * MIB, pb.SOURCE_SERVER), "max_assembly_bytes")
    assert wait_until(lambda: _held_bytes(server) == 0, timeout=10)  # the refused call gave its bytes back
    assert Upload("server", 6 * MIB, pb.SOURCE_SERVER).send(stub).inserted
    assert _stored_ids(stub, "server") == ["big"]


def test_calls_share_the_budget_and_give_it_back(server: Server) -> None:
    stub = _stub(server)
    with _upload_held(server, stub, 6 * MIB):
        with pytest.raises(grpc.RpcError) as refused:  # 6 MiB held + 4 MiB > 8 MiB
            Upload("second", 4 * MIB, pb.SOURCE_SERVER).send(stub)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_assembly_bytes" in (refused.value.details() or "")
        assert error_reason(refused.value) == "SERVER_BUSY"  # for now: it fits once the first is done
    assert Upload("second", 4 * MIB, pb.SOURCE_SERVER).send(stub).inserted


def test_an_import_stream_ending_inside_a_message_gives_its_bytes_back(server: Server) -> None:
    stub = _stub(server)

    def frames() -> Iterator[pb.ImportMessagesRequest]:
        yield pb.ImportMessagesRequest(object_key="import", json_piece=HEAD, more_pieces=True)
        for _ in range(4 * MIB // len(PIECE)):
            yield pb.ImportMessagesRequest(json_piece=PIECE, more_pieces=True)

    with pytest.raises(grpc.RpcError) as refused:
        stub.ImportMessages(frames(), metadata=routing("import"), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert wait_until(lambda: _held_bytes(server) == 0, timeout=10)
    # The whole budget is free again: a message of 7 MiB in pieces goes through.
    pieces = [HEAD, *[PIECE] * (7 * MIB // len(PIECE)), TAIL]
    whole = [
        pb.ImportMessagesRequest(object_key="import" if i == 0 else "", json_piece=p, more_pieces=i < len(pieces) - 1)
        for i, p in enumerate(pieces)
    ]
    assert stub.ImportMessages(iter(whole), metadata=routing("import"), timeout=60).imported_count == 1


def _whole(message_id: str, size: int) -> str:
    return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{"w" * size}"}}]}}'


def test_whole_messages_are_charged_while_they_are_written(server: Server) -> None:
    """Unary writes hold their messages too, and writing takes several times their size: a batch
    whose messages pass the budget is refused unwritten, one within it is stored, and each gives
    its bytes back."""
    stub = _stub(server)
    too_many = [pb.AppendItem(message_json=_whole(f"m{i}", 3 * MIB), source=pb.SOURCE_SERVER) for i in range(3)]
    with pytest.raises(grpc.RpcError) as refused:  # 9 MiB > 8 MiB
        stub.AppendMessages(pb.AppendMessagesRequest(object_key="batch", items=too_many), metadata=routing("batch"))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_assembly_bytes" in (refused.value.details() or "")
    assert error_reason(refused.value) == "LIMIT_EXCEEDED"
    assert _stored_ids(stub, "batch") == []
    assert _held_bytes(server) == 0
    request = pb.AppendMessagesRequest(object_key="batch", items=too_many[:2], omit_json_as_sent=True)
    assert [r.inserted for r in stub.AppendMessages(request, metadata=routing("batch")).results] == [True, True]
    assert _stored_ids(stub, "batch") == ["m0", "m1"]
    assert _held_bytes(server) == 0


def test_unary_writes_share_the_budget_with_pieces(server: Server) -> None:
    """While an upload holds 6 MiB of the 8, each kind of unary write of 3 MiB is refused; once it
    is stored, they go through."""
    stub = _stub(server)
    text = _whole("w", 3 * MIB)
    writes = {
        "AppendMessage": lambda: stub.AppendMessage(
            pb.AppendMessageRequest(object_key="unary", message_json=text), metadata=routing("unary")
        ),
        "UpdateMessage": lambda: stub.UpdateMessage(
            pb.UpdateMessageRequest(object_key="unary", message_json=text), metadata=routing("unary")
        ),
        "UpsertMessage": lambda: stub.UpsertMessage(
            pb.UpsertMessageRequest(object_key="unary", message_json=text), metadata=routing("unary")
        ),
    }
    with _upload_held(server, stub, 6 * MIB):
        for method, write in writes.items():
            with pytest.raises(grpc.RpcError) as refused:
                write()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, method
            assert "max_assembly_bytes" in (refused.value.details() or ""), method
            assert error_reason(refused.value) == "SERVER_BUSY", method
        assert _stored_ids(stub, "unary") == []
    for write in writes.values():
        write()
    assert _stored_ids(stub, "unary") == ["w"]
    assert _held_bytes(server) == 0


def test_small_writes_go_through_while_pieces_hold_the_whole_budget(server: Server) -> None:
    """A security audit held the whole budget with one upload kept open (a piece a minute): every
    other tenant's 60-byte append was refused SERVER_BUSY for as long as it liked. Writes of up
    to 1 MiB are charged to a pool of their own (an eighth of the budget here: 1 MiB); larger ones
    still share the budget with pieces."""
    stub = _stub(server)
    small = _whole("small", 300 * 1024)  # more than the budget has left: under 256 KiB
    large = _whole("large", 2 * MIB)
    with _upload_held(server, stub, 8 * MIB - len(PIECE)):
        for method, request in (
            ("AppendMessage", pb.AppendMessageRequest(object_key="small", message_json=small)),
            ("UpsertMessage", pb.UpsertMessageRequest(object_key="small", message_json=small)),
            ("UpdateMessage", pb.UpdateMessageRequest(object_key="small", message_json=small)),
        ):
            getattr(stub, method)(request, metadata=routing("small"))
        batch = pb.AppendMessagesRequest(
            object_key="small", items=[pb.AppendItem(message_json=_whole(f"b{i}", 150 * 1024)) for i in range(3)]
        )
        assert [r.inserted for r in stub.AppendMessages(batch, metadata=routing("small")).results] == [True] * 3
        with pytest.raises(grpc.RpcError) as refused:
            stub.AppendMessage(
                pb.AppendMessageRequest(object_key="large", message_json=large), metadata=routing("large")
            )
        assert error_reason(refused.value) == "SERVER_BUSY"
    assert _stored_ids(stub, "small") == ["small", "b0", "b1", "b2"]
    assert _held_bytes(server) == 0
    assert _held_bytes(server, "sessions_small_write_bytes") == 0  # each write gave its charge back


def test_a_message_whose_pieces_barely_move_is_refused_after_its_first_minute() -> None:
    """The next frame's 60 s bound was kept by an empty piece a minute, and the message held its
    share of the budget for as long as its sender liked. After a minute a message must have come
    at 64 KiB/s on average. (The clock is the test's: no waiting.)"""
    now = [0.0]
    budget = AssemblyBudget(64 * MIB)
    slow = Pieces(budget, clock=lambda: now[0])
    slow.add("x" * 1_000)
    now[0] = 59.0
    slow.add("")  # within the first minute: any pace
    now[0] = 61.0
    with pytest.raises(LimitExceeded) as refused:
        slow.add("")
    assert refused.value.metadata["limit"] == "min_piece_bytes_per_second"
    assert "came at 16 bytes/s on average" in str(refused.value)
    slow.release()
    assert budget.held_bytes == 0

    steady = Pieces(budget, clock=lambda: now[0])
    now[0] = 0.0
    steady.add("y" * 100)
    now[0] = 120.0
    steady.add("y" * (64 * 1024 * 120))  # exactly the rate since its first piece
    assert budget.held_bytes == 100 + 64 * 1024 * 120
    steady.hand_over()()  # the next message's minute starts at its own first piece
    now[0] = 500.0
    steady.add("z")
    now[0] = 530.0
    steady.add("")
    steady.release()
    assert budget.held_bytes == 0

    async def server_waits(pieces: Pieces) -> None:
        async with pieces.excused():  # the import's own writes, 90 s
            now[0] += 90.0

    waited = Pieces(budget, clock=lambda: now[0])
    now[0] = 1_000.0
    waited.add("w" * 1_000)
    asyncio.run(server_waits(waited))
    now[0] = 1_100.0
    waited.add("")  # 1,000 bytes in the 10 s that were the sender's
    waited.release()
    assert budget.held_bytes == 0
