"""The Python clients try a failed call again when the server refused it before acting (an object
move here; a drain and a re-shard answer the same way) and, for methods safe to repeat, when the
connection failed; never past the call's deadline, and not at all when turned off."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import DEFAULT_RETRY_POLICY, RetryNotice, RetryPolicy, SessionsClient, SessionsError
from sessions_client._retry import resubscribe_delay
from sessions_client.admin import abort_move, erase_object, export_file, import_file
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server
from tests.deploy.support import free_port
from tests.relay import Relay, pass_bytes
from tests.reliability.support import wait_until
from tests.service.support import text_message

QUICK = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.001)


def _lock_for_move(stub: Any, object_key: str) -> None:
    """Takes the object's move lock for an hour: writes are refused UNAVAILABLE / OBJECT_MOVING
    until AbortMove."""
    request = pb.ExportObjectRequest(object_key=object_key, lock_for_move=True, lease_seconds=3600)
    for _ in stub.ExportObject(request):
        pass


def _releasing(stub: Any, object_key: str, notices: list[RetryNotice]) -> Callable[[RetryNotice], None]:
    """An observer that records each notice and releases the move lock at the first."""

    def on_retry(notice: RetryNotice) -> None:
        notices.append(notice)
        if len(notices) == 1:
            stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))

    return on_retry


def _summary(notices: list[RetryNotice]) -> list[tuple[str, int, grpc.StatusCode, str | None]]:
    return [(n.method, n.attempt, n.error.code, n.error.reason) for n in notices]


@pytest.fixture
def dead_address() -> Iterator[str]:
    """A loopback address where nothing listens."""
    yield f"127.0.0.1:{free_port()}"


def _failing_against(dead_address: str, run: Callable[[Any], Any]) -> list[RetryNotice]:
    """The retry notices of `run` on a session of a server that is not there; the call must
    end UNAVAILABLE."""
    notices: list[RetryNotice] = []
    with (
        SessionsClient(dead_address, retry=QUICK, on_retry=notices.append) as client,
        pytest.raises(SessionsError) as failed,
    ):
        run(client.object("k").session())
    assert failed.value.code == grpc.StatusCode.UNAVAILABLE
    return notices


# Each write, with what must hold after it succeeded. The large append goes through the
# client-streaming UploadMessage, whose frames must be sent again from the start.
WRITES: dict[str, tuple[str, Callable[[Any], Any], Callable[[Any], bool]]] = {
    "append": ("AppendMessage", lambda s: s.append_message(text_message("m1")), lambda s: s.get_message("m1")),
    "batch": (
        "AppendMessages",
        lambda s: s.append_messages([text_message("m1"), text_message("m2")]),
        lambda s: s.get_message("m2"),
    ),
    "upload": (
        "UploadMessage",
        lambda s: s.append_message(text_message("m1", "u" * 4_000_000)),
        lambda s: s.get_message("m1") == text_message("m1", "u" * 4_000_000),
    ),
    "update": (
        "UpdateMessage",
        lambda s: s.update_message(text_message("m0", "changed")),
        lambda s: s.get_message("m0") == text_message("m0", "changed"),
    ),
    "delete": ("DeleteMessages", lambda s: s.delete_messages(["m0"]), lambda s: s.get_message("m0") is None),
    "clear": ("ClearMessages", lambda s: s.clear_messages(), lambda s: s.get_history() == []),
    "compaction": (
        "AddCompaction",
        lambda s: s.add_compaction("summary", "m0", "m0"),
        lambda s: len(s.list_compactions()) == 1,
    ),
    # A list of messages is in hand: its frames are made again for the next attempt.
    "import": (
        "ImportMessages",
        lambda s: s.import_messages([text_message("m1"), text_message("m2")]),
        lambda s: [m["id"] for m in s.get_history(leaf_id="m2")] == ["m1", "m2"],
    ),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_refused_during_a_move_is_tried_again_once_the_lock_is_gone(
    live_server: LiveServer, stub: Any, object_key: str, write: str
) -> None:
    """Any method, even one unsafe to repeat (clear, compaction): the server did nothing."""
    method, run, done = WRITES[write]
    notices: list[RetryNotice] = []
    with SessionsClient(live_server.address, on_retry=_releasing(stub, object_key, notices)) as client:
        session = client.object(object_key).session()
        session.append_message(text_message("m0"))
        _lock_for_move(stub, object_key)
        run(session)
        assert _summary(notices) == [(method, 1, grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")]
        assert done(session)


def test_a_file_import_refused_during_a_move_is_sent_again_once_the_lock_is_gone(
    live_server: LiveServer, stub: Any, object_key: str, tmp_path: Path
) -> None:
    """`import_file` has the store's copy in hand: a refusal before acting sends it again (it
    raised OBJECT_MOVING to the caller, whatever the client's policy)."""
    notices: list[RetryNotice] = []
    with SessionsClient(live_server.address, on_retry=_releasing(stub, object_key, notices)) as client:
        source = client.object(f"{object_key}-source").session()
        source.append_messages([text_message("s1"), text_message("s2")])
        saved = export_file(client, f"{object_key}-source", tmp_path / "source.sqlite")
        client.object(object_key).session().append_message(text_message("m0"))
        _lock_for_move(stub, object_key)
        report = import_file(client, object_key, saved.path, replace=True)
        assert _summary(notices) == [("ImportObject", 1, grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")]
        assert report.message_rows == 2
        assert [m["id"] for m in client.object(object_key).session().get_history()] == ["s1", "s2"]

        _lock_for_move(stub, object_key)
        with pytest.raises(SessionsError) as refused:
            import_file(client.with_options(retry=None), object_key, saved.path, replace=True)
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")
        stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))


def test_with_retries_off_the_refusal_reaches_the_caller_and_nothing_is_stored(
    live_server: LiveServer, stub: Any, object_key: str
) -> None:
    with SessionsClient(live_server.address, retry=None) as client:
        session = client.object(object_key).session()
        session.append_message(text_message("m0"))
        _lock_for_move(stub, object_key)
        try:
            with pytest.raises(SessionsError) as refused:
                session.append_message(text_message("m1"))
            assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")
        finally:
            stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))
        assert session.get_message("m1") is None


def test_a_refusal_that_outlasts_the_attempts_reaches_the_caller(
    live_server: LiveServer, stub: Any, object_key: str
) -> None:
    notices: list[RetryNotice] = []
    with SessionsClient(live_server.address, retry=QUICK, on_retry=notices.append) as client:
        session = client.object(object_key).session()
        session.append_message(text_message("m0"))
        _lock_for_move(stub, object_key)
        try:
            with pytest.raises(SessionsError) as refused:
                session.append_message(text_message("m1"))
        finally:
            stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))
    assert refused.value.reason == "OBJECT_MOVING"
    assert [n.attempt for n in notices] == [1, 2]  # three attempts in all


@pytest.mark.parametrize(
    ("method", "run"),
    [
        ("GetMessage", lambda s: s.get_message("m1")),
        ("StreamHistory", lambda s: s.get_history()),
        ("AppendMessage", lambda s: s.append_message(text_message("m1"))),
        ("DeleteMessages", lambda s: s.delete_messages(["m1"])),
        ("ImportMessages", lambda s: s.import_messages([text_message("m1")])),
    ],
)
def test_a_call_safe_to_repeat_is_tried_again_after_a_connection_failure(
    dead_address: str, method: str, run: Callable[[Any], Any]
) -> None:
    notices = _failing_against(dead_address, run)
    assert _summary(notices) == [
        (method, 1, grpc.StatusCode.UNAVAILABLE, None),
        (method, 2, grpc.StatusCode.UNAVAILABLE, None),
    ]


@pytest.mark.parametrize(
    "run",
    [
        lambda s: s.clear_messages(),
        lambda s: s.add_compaction("summary", "a", "b"),
        lambda s: s.import_messages(iter([text_message("m1")])),
    ],
    ids=["clear", "compaction", "import-from-iterator"],
)
def test_a_call_unsafe_to_repeat_is_not_tried_again_after_a_connection_failure(
    dead_address: str, run: Callable[[Any], Any]
) -> None:
    """The first attempt may have been carried out: a repeat could clear what others appended
    meanwhile, or add a second compaction; an iterator's messages cannot be read twice."""
    assert _failing_against(dead_address, run) == []


def test_an_import_from_an_iterator_is_not_tried_again_even_when_refused_before_acting(
    live_server: LiveServer, stub: Any, object_key: str
) -> None:
    """The refusal reaches the caller, who holds what the iterator yielded: nothing was stored."""
    notices: list[RetryNotice] = []
    with SessionsClient(live_server.address, on_retry=notices.append) as client:
        session = client.object(object_key).session()
        session.append_message(text_message("m0"))
        _lock_for_move(stub, object_key)
        try:
            with pytest.raises(SessionsError) as refused:
                session.import_messages(iter([text_message("m1"), text_message("m2")]))
        finally:
            stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")
        assert notices == []
        assert session.get_message("m1") is None


def test_a_retried_import_counts_what_an_earlier_attempt_stored_as_skipped(
    live_server: LiveServer, object_key: str
) -> None:
    """The first attempt stores the messages but its answer is lost on the way (the relay cuts the
    connection once the server answered); the second finds them all stored. Nothing is stored
    twice, and the result says what the last attempt did."""
    notices: list[RetryNotice] = []
    relay = AnswerLosingRelay(live_server.address)
    try:
        with SessionsClient(relay.address, on_retry=notices.append) as client:
            session = client.object(object_key).session()
            result = session.import_messages([text_message("m1"), text_message("m2")])
            assert relay.lost_answers == 1
            assert _summary(notices) == [("ImportMessages", 1, grpc.StatusCode.UNAVAILABLE, None)]
            assert (result.imported, result.skipped) == (0, 2)
            assert [m["id"] for m in session.get_history()] == ["m1", "m2"]
    finally:
        relay.close()


class AnswerLosingRelay(Relay):
    """A TCP relay that loses the first answer on its first connection, once the server's answer
    begins (its first HTTP/2 HEADERS frame on a stream): the call was carried out, and the client
    never learns it. By default the relay closes the connection there; `without_status` first
    passes the response's headers on and ends the stream with an empty DATA frame, without
    trailers, as HAProxy ends a call whose server connection failed under it. Later connections
    pass everything."""

    def __init__(self, target: str, *, without_status: bool = False) -> None:
        self.lost_answers = 0
        self._without_status = without_status
        self._lock = threading.Lock()
        super().__init__(target)

    def pump(self, source: socket.socket, sink: socket.socket, *, from_server: bool) -> None:
        if not from_server:
            with contextlib.suppress(OSError):
                while data := source.recv(65536):
                    with contextlib.suppress(OSError):  # once the server's side is shut, read and dropped
                        sink.sendall(data)
            return
        pending = b""
        try:
            while data := source.recv(65536):
                pending += data
                while len(pending) >= 9:  # a frame header: length (3), type, flags, stream (4)
                    size = int.from_bytes(pending[:3], "big") + 9
                    kind, stream = pending[3], int.from_bytes(pending[5:9], "big") & 0x7FFFFFFF
                    if len(pending) < size:
                        break
                    if kind == 1 and stream != 0 and self._lose_this_answer():
                        if not self._without_status:
                            for sock in (source, sink):
                                sock.shutdown(socket.SHUT_RDWR)
                            return
                        # The stream's end, then the connection's, whose requests are still read
                        # (a reset could reach the client before the frame).
                        end_stream = (0).to_bytes(3, "big") + bytes([0, 1]) + stream.to_bytes(4, "big")
                        sink.sendall(pending[:size] + end_stream)
                        sink.shutdown(socket.SHUT_WR)
                        source.shutdown(socket.SHUT_RDWR)
                        return
                    sink.sendall(pending[:size])
                    pending = pending[size:]
        except OSError:
            pass

    def _lose_this_answer(self) -> bool:
        with self._lock:
            if self.lost_answers:
                return False
            self.lost_answers = 1
            return True


@pytest.mark.parametrize("read", [False, True])
def test_a_call_a_proxy_ended_without_the_servers_status_is_tried_again_when_safe_to_repeat(
    live_server: LiveServer, object_key: str, read: bool
) -> None:
    """Through HAProxy, a shard stopped under calls ended them without a status (the stream ended
    with no trailers), which gRPC reports as UNKNOWN "Stream removed", and the client tried
    nothing again: uploads of large messages failed. It is a failed connection now, UNAVAILABLE
    without a reason: an append (here carried out before its answer was lost) and a stream before
    its first response are tried again."""
    session_of = lambda client: client.object(object_key).session()  # noqa: E731
    with SessionsClient(live_server.address) as direct:
        session_of(direct).append_message(text_message("m0"))
    notices: list[RetryNotice] = []
    relay = AnswerLosingRelay(live_server.address, without_status=True)
    try:
        with SessionsClient(relay.address, on_retry=notices.append) as client:
            if read:
                assert [m["id"] for m in session_of(client).get_history()] == ["m0"]
                method = "StreamHistory"
            else:
                assert session_of(client).append_message(text_message("m1")).inserted is False
                method = "AppendMessage"
        assert relay.lost_answers == 1
        assert _summary(notices) == [(method, 1, grpc.StatusCode.UNAVAILABLE, None)]
        assert "without the server's status" in notices[0].error.message
        assert "Stream removed" in notices[0].error.message
        with SessionsClient(live_server.address) as direct:
            assert [m["id"] for m in session_of(direct).get_history()] == ["m0"] + ([] if read else ["m1"])
    finally:
        relay.close()


def test_a_clear_a_proxy_ended_without_the_servers_status_is_not_repeated(
    live_server: LiveServer, object_key: str
) -> None:
    """The server cleared the session, but its answer never came: a repeat could remove what was
    appended since, so the caller gets UNAVAILABLE, and decides."""
    with SessionsClient(live_server.address) as direct:
        direct.object(object_key).session().append_messages([text_message("m0"), text_message("m1")])
    notices: list[RetryNotice] = []
    relay = AnswerLosingRelay(live_server.address, without_status=True)
    try:
        with SessionsClient(relay.address, on_retry=notices.append) as client, pytest.raises(SessionsError) as failed:
            client.object(object_key).session().clear_messages()
        assert (failed.value.code, failed.value.reason, notices) == (grpc.StatusCode.UNAVAILABLE, None, [])
        with SessionsClient(live_server.address) as direct:
            assert direct.object(object_key).session().get_history() == []
    finally:
        relay.close()


def test_the_asyncio_client_sends_an_upload_ended_without_a_status_again(
    live_server: LiveServer, object_key: str
) -> None:
    """The audit's case: a large message's upload whose stream HAProxy ended without a status
    (gRPC's server sends an upload's response headers as it starts reading it)."""
    from sessions_client.aio import SessionsClient as AsyncClient

    notices: list[RetryNotice] = []
    relay = AnswerLosingRelay(live_server.address, without_status=True)
    large = text_message("m1", "u" * 4_000_000)

    async def upload() -> None:
        async with AsyncClient(relay.address, on_retry=notices.append) as client:
            await client.object(object_key).session().append_message(large)

    try:
        asyncio.run(upload())
        assert _summary(notices) == [("UploadMessage", 1, grpc.StatusCode.UNAVAILABLE, None)]
        assert "without the server's status" in notices[0].error.message
        with SessionsClient(live_server.address) as direct:
            assert direct.object(object_key).session().get_history() == [large]
    finally:
        relay.close()


def test_the_timeout_covers_every_attempt_and_wait(dead_address: str) -> None:
    """A policy that would wait 100 × 0.1 s gives up at the 0.3 s deadline instead."""
    notices: list[RetryNotice] = []
    patient = RetryPolicy(max_attempts=100, initial_backoff=0.1, max_backoff=0.1, multiplier=1.0)
    with (
        SessionsClient(dead_address, retry=patient, on_retry=notices.append, timeout=0.3) as client,
        pytest.raises(SessionsError) as failed,
    ):
        client.object("k").session().get_message("m1")
    assert failed.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert 1 <= len(notices) <= 6  # waits of 0.05-0.1 s within 0.3 s
    assert sum(n.delay for n in notices) < 0.3


def test_an_append_rides_through_a_server_restart(tmp_path: Path) -> None:
    """The server is down when the append is made and comes back on the same address while the
    client waits: the append lands once, in order after what was there."""
    first = start_server(tmp_path / "data")
    address = first.address
    with SessionsClient(address) as client:
        client.object("k").session().append_message(text_message("m0"))
    first.stop()
    restarted: list[LiveServer] = []

    def restart(notice: RetryNotice) -> None:
        if not restarted:
            restarted.append(start_server(tmp_path / "data", listen=address))

    try:
        with SessionsClient(address, on_retry=restart) as client:
            session = client.object("k").session()
            result = session.append_message(text_message("m1"))
            assert (result.inserted, result.parent_id) == (True, "m0")
            assert [m["id"] for m in session.get_history()] == ["m0", "m1"]
        assert len(restarted) == 1
    finally:
        for server in restarted:
            server.stop()


def test_abort_move_rides_through_the_sources_restart(tmp_path: Path) -> None:
    """A client audit: `abort_move` made one attempt, so an operator's process that called it
    as the source came back (a move cut short, the source restarted) failed UNAVAILABLE. It is
    asked again under the client's retry policy, each wait told to `on_retry`; the lock, kept
    across the restart, is released and the object takes writes."""
    first = start_server(tmp_path / "data")
    address = first.address
    with SessionsClient(address) as client:
        client.object("k").session().append_message(text_message("m0"))
    with grpc.insecure_channel(address) as channel:
        _lock_for_move(pb_grpc.SessionServiceStub(channel), "k")
    first.stop()
    restarted: list[LiveServer] = []
    notices: list[RetryNotice] = []

    def restart(notice: RetryNotice) -> None:
        notices.append(notice)
        if not restarted:
            restarted.append(start_server(tmp_path / "data", listen=address))

    try:
        with SessionsClient(address, on_retry=restart) as client:
            assert abort_move(client, "k")
            assert client.object("k").session().append_message(text_message("m1")).inserted
        assert len(restarted) == 1
        assert notices[0].method == "AbortMove" and notices[0].error.code == grpc.StatusCode.UNAVAILABLE
    finally:
        for server in restarted:
            server.stop()


def test_erase_object_rides_through_the_servers_restart(tmp_path: Path) -> None:
    """`erase_object` made one attempt: an operator's erase sent as the server restarted failed
    UNAVAILABLE and the user's data stayed. It is asked again under the client's retry policy."""
    data = tmp_path / "data"
    first = start_server(data)
    address = first.address
    with SessionsClient(address) as client:
        client.object("user-1").session().append_message(text_message("m0", "private words"))
    first.stop()
    restarted: list[LiveServer] = []
    notices: list[RetryNotice] = []

    def restart(notice: RetryNotice) -> None:
        notices.append(notice)
        if not restarted:
            restarted.append(start_server(data, listen=address))

    try:
        with SessionsClient(address, on_retry=restart) as client:
            assert erase_object(client, "user-1")
            assert client.object("user-1").session().get_history() == []
        assert len(restarted) == 1
        assert notices[0].method == "DeleteObject" and notices[0].error.code == grpc.StatusCode.UNAVAILABLE
        assert notices[0].error.message.startswith("failed to connect to all addresses")  # never sent
    finally:
        for server in restarted:
            server.stop()


def test_the_asyncio_client_retries_the_same_way(live_server: LiveServer, stub: Any, object_key: str) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    notices: list[RetryNotice] = []

    async def scenario() -> bool:
        async with AsyncClient(live_server.address, on_retry=_releasing(stub, object_key, notices)) as client:
            session = client.object(object_key).session()
            await session.append_message(text_message("m0"))
            _lock_for_move(stub, object_key)
            await session.append_message(text_message("m1", "u" * 4_000_000))  # an upload, sent again
            return await session.get_message("m1") == text_message("m1", "u" * 4_000_000)

    assert asyncio.run(scenario())
    assert _summary(notices) == [("UploadMessage", 1, grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")]


def test_the_asyncio_client_sends_an_import_in_hand_again_and_an_iterator_s_once(
    live_server: LiveServer, stub: Any, object_key: str
) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    notices: list[RetryNotice] = []

    async def scenario() -> tuple[int, str | None, list[str]]:
        async with AsyncClient(live_server.address, on_retry=_releasing(stub, object_key, notices)) as client:
            session = client.object(object_key).session()
            await session.append_message(text_message("m0"))
            _lock_for_move(stub, object_key)
            imported = (await session.import_messages([text_message("m1"), text_message("m2")])).imported
            _lock_for_move(stub, object_key)
            try:
                await session.import_messages(iter([text_message("m3")]))
            except SessionsError as error:
                reason = error.reason
            finally:
                stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))
            return imported, reason, [m["id"] async for m in session.history()]

    assert asyncio.run(scenario()) == (2, "OBJECT_MOVING", ["m1", "m2"])
    assert _summary(notices) == [("ImportMessages", 1, grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")]


def test_the_asyncio_client_gives_up_on_unsafe_calls_and_at_the_deadline(dead_address: str) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    notices: list[RetryNotice] = []

    async def scenario() -> list[grpc.StatusCode]:
        codes = []
        async with AsyncClient(dead_address, retry=QUICK, on_retry=notices.append) as client:
            session = client.object("k").session()
            for run in (session.clear_messages, lambda: session.get_history(newest_first=True)):
                try:
                    await run()
                except SessionsError as error:
                    codes.append(error.code)
        return codes

    assert asyncio.run(scenario()) == [grpc.StatusCode.UNAVAILABLE] * 2
    assert [(n.method, n.attempt) for n in notices] == [("StreamHistory", 1), ("StreamHistory", 2)]


class HoldingRelay(Relay):
    """A TCP relay to a server that passes `hold_after` bytes from the server on each connection,
    then holds the rest until `cut()` closes every connection: the client sees its connection fail
    in the middle of a response stream, at a moment the test chooses.

    The cut waits for the test, not for a byte count alone: gRPC drops the messages it has
    buffered but not yet handed to the caller when the transport closes, so a cut that merely
    follows the bytes can land before the caller took its first message (a busy machine), and a
    retry is then right."""

    def __init__(self, target: str, hold_after: int) -> None:
        self._hold_after = hold_after
        self._cut = threading.Event()
        super().__init__(target)

    def close(self) -> None:
        self._cut.set()
        super().close()

    def cut(self) -> None:
        self._cut.set()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def pump(self, source: socket.socket, sink: socket.socket, *, from_server: bool) -> None:
        pass_bytes(source, sink, self._hold_after if from_server else None)
        self._cut.wait()


@pytest.fixture
def long_history(live_server: LiveServer, stub: Any, object_key: str) -> str:
    """An object whose history (40 × 200 KB) is far longer than the relay lets through."""
    with SessionsClient(live_server.address) as client:
        session = client.object(object_key).session()
        for batch in range(4):
            session.append_messages([text_message(f"m{batch}-{i}", "x" * 200_000) for i in range(10)])
    return object_key


def test_a_stream_is_not_tried_again_once_it_has_delivered(live_server: LiveServer, long_history: str) -> None:
    """A repeat would hand the caller the first messages a second time: the failure reaches it
    instead, after what was delivered."""
    relay = HoldingRelay(live_server.address, hold_after=2_500_000)
    notices: list[RetryNotice] = []
    received: list[str] = []
    try:
        with (
            SessionsClient(relay.address, retry=QUICK, on_retry=notices.append) as client,
            pytest.raises(SessionsError) as failed,
        ):
            for message in client.object(long_history).session().history():
                received.append(message["id"])
                relay.cut()
    finally:
        relay.close()
    assert failed.value.code == grpc.StatusCode.UNAVAILABLE
    assert 1 <= len(received) < 40 and len(set(received)) == len(received)
    assert (notices, relay.connections) == ([], 1)


def test_the_asyncio_client_does_not_try_a_stream_again_once_it_has_delivered(
    live_server: LiveServer, long_history: str
) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    relay = HoldingRelay(live_server.address, hold_after=2_500_000)
    notices: list[RetryNotice] = []

    async def scenario() -> tuple[list[str], grpc.StatusCode | None]:
        received: list[str] = []
        async with AsyncClient(relay.address, retry=QUICK, on_retry=notices.append) as client:
            try:
                async for message in client.object(long_history).session().history():
                    received.append(message["id"])
                    relay.cut()
            except SessionsError as error:
                return received, error.code
        return received, None

    try:
        received, code = asyncio.run(scenario())
    finally:
        relay.close()
    assert code == grpc.StatusCode.UNAVAILABLE
    assert 1 <= len(received) < 40 and len(set(received)) == len(received)
    assert (notices, relay.connections) == ([], 1)


def test_a_policy_refuses_settings_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="negative"):
        RetryPolicy(initial_backoff=-1)
    with pytest.raises(ValueError, match="multiplier"):
        RetryPolicy(multiplier=0.5)


def _check_timeouts(cls: Any) -> Any:
    """Checks the timeouts `cls` takes; returns the client it made, to close."""
    for timeout in (0, -1, float("nan"), float("inf"), 1e10):
        with pytest.raises(ValueError, match=r"timeout must be greater than 0 seconds and at most 1e\+09, or None"):
            cls("127.0.0.1:1", timeout=timeout)
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        cls("127.0.0.1:1", timeout="5")
    client = cls("127.0.0.1:1", timeout=Fraction(5, 2))
    assert (client.timeout, client.with_options(timeout=None).timeout) == (2.5, None)
    with pytest.raises(ValueError, match="greater than 0"):
        client.with_options(timeout=0)
    assert client.timeout == 2.5
    return client


def test_a_timeout_of_0_or_less_or_past_grpcs_reach_is_refused_as_it_failed_every_call() -> None:
    """Go's WithCallTimeout(0) is no deadline; a timeout of 0 here was a deadline already past,
    and so was one of 1e10 s. Refused before a channel is made (it would stay open)."""
    from sessions_client.aio import SessionsClient as AsyncClient

    _check_timeouts(SessionsClient).close()

    async def asyncio_client() -> None:  # its channel needs the running loop
        await _check_timeouts(AsyncClient).close()

    asyncio.run(asyncio_client())


def test_waits_grow_to_the_ceiling_with_jitter_below_it() -> None:
    policy = RetryPolicy(initial_backoff=0.1, multiplier=2.0, max_backoff=0.5)
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (9, 0.5)]:
        waits = [policy.backoff(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits), attempt
        assert max(waits) - min(waits) > ceiling / 10  # jittered, not fixed


def test_a_subscriptions_reconnections_wait_longer_each_time_with_jitter() -> None:
    """The subscribers of a server that went away do not all come back at the same instant."""
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (4, 0.8), (5, 1.6), (6, 2.0), (20, 2.0), (40, 2.0), (2000, 2.0)]:
        waits = [resubscribe_delay(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits), attempt
        assert max(waits) - min(waits) > ceiling / 10  # jittered, not fixed


def test_a_view_with_other_options_shares_the_connection_and_leaves_the_client_as_it_was(
    live_server: LiveServer, stub: Any, object_key: str
) -> None:
    """`with_options` changes the options of the calls made through the view only: here the view
    does not retry and surfaces the move's refusal, while the client itself retries past it.
    Closing the view keeps the connection; closing the client closes it for both."""
    notices: list[RetryNotice] = []
    client = SessionsClient(live_server.address, on_retry=_releasing(stub, object_key, notices))
    try:
        impatient = client.with_options(retry=None, timeout=5.0)
        assert (impatient.retry, impatient.timeout, impatient.on_retry) == (None, 5.0, client.on_retry)
        assert (client.retry, client.timeout) == (DEFAULT_RETRY_POLICY, None)
        impatient.object(object_key).session().append_message(text_message("m0"))
        _lock_for_move(stub, object_key)
        with pytest.raises(SessionsError) as refused:
            impatient.object(object_key).session().append_message(text_message("m1"))
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")
        assert notices == []
        client.object(object_key).session().append_message(text_message("m1"))  # retried past the lock
        assert _summary(notices) == [("AppendMessage", 1, grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")]
        impatient.close()
        assert [m["id"] for m in client.object(object_key).session().get_history()] == ["m0", "m1"]
    finally:
        client.close()
    with pytest.raises(SessionsError) as closed:
        impatient.object(object_key).session().get_history()
    assert (closed.value.code, closed.value.message) == (grpc.StatusCode.CANCELLED, "the client is closed")


def test_a_view_s_timeout_bounds_its_calls_only(dead_address: str) -> None:
    notices: list[RetryNotice] = []
    patient = RetryPolicy(max_attempts=100, initial_backoff=0.1, max_backoff=0.1, multiplier=1.0)
    with SessionsClient(dead_address, retry=patient, on_retry=notices.append) as client:
        with pytest.raises(SessionsError) as failed:
            client.with_options(timeout=0.3).object("k").session().get_message("m1")
        assert failed.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert 1 <= len(notices) <= 6 and client.timeout is None
        notices.clear()
        with pytest.raises(SessionsError) as failed:
            client.with_options(retry=QUICK).object("k").session().get_message("m1")
        assert failed.value.code == grpc.StatusCode.UNAVAILABLE
        assert [n.attempt for n in notices] == [1, 2]  # the view's policy, and the client's observer


def test_the_asyncio_client_makes_views_the_same_way(live_server: LiveServer, stub: Any, object_key: str) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    async def scenario() -> tuple[str | None, list[str]]:
        client = AsyncClient(live_server.address)
        try:
            impatient = client.with_options(retry=None)
            await impatient.object(object_key).session().append_message(text_message("m0"))
            _lock_for_move(stub, object_key)
            try:
                await impatient.object(object_key).session().append_message(text_message("m1"))
                reason = None
            except SessionsError as error:
                reason = error.reason
            stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))
            await impatient.close()
            history = await client.object(object_key).session().get_history()
            return reason, [m["id"] for m in history]
        finally:
            await client.close()

    assert asyncio.run(scenario()) == ("OBJECT_MOVING", ["m0"])


def _held_upload(key: str, size: int, hold: threading.Event) -> Iterator[pb.UploadMessageRequest]:
    """Frames of an upload of `size` bytes of text whose last piece waits for `hold`: until then
    the server holds what came of it."""
    header = pb.UploadHeader(object_key=key, operation=pb.UPLOAD_OPERATION_APPEND, source=pb.SOURCE_SERVER)
    yield pb.UploadMessageRequest(
        header=header, json_piece='{"id":"held","role":"user","parts":[{"type":"text","text":"'
    )
    for _ in range(size // (256 * 1024)):
        yield pb.UploadMessageRequest(json_piece="h" * 256 * 1024)
    hold.wait()
    yield pb.UploadMessageRequest(json_piece='"}]}')


def test_a_write_refused_while_the_server_is_busy_with_large_messages_is_tried_again(tmp_path: Path) -> None:
    """An upload holds 7 MiB of the server's 8 MiB for messages being received or written: a 2 MiB
    append is refused SERVER_BUSY before anything is done, and lands once the upload is stored.
    A message larger than the whole budget is refused for good, without a retry."""
    server = start_server(tmp_path / "data", limits=Limits(max_assembly_bytes=8 * 1024 * 1024))
    hold = threading.Event()
    stub = pb_grpc.SessionServiceStub(grpc.insecure_channel(server.address))
    uploaded: list[Any] = []
    sender = threading.Thread(
        target=lambda: uploaded.append(
            stub.UploadMessage(_held_upload("k", 7 * 1024 * 1024, hold), metadata=(("x-object-key", "k"),))
        )
    )
    notices: list[RetryNotice] = []

    def on_retry(notice: RetryNotice) -> None:
        notices.append(notice)
        hold.set()
        sender.join()  # the upload is stored and its bytes given back before the next attempt

    try:
        sender.start()
        with SessionsClient(server.address, on_retry=on_retry) as client:
            session = client.object("k").session()
            held = server.running.metrics.registry
            assert wait_until(lambda: (held.get_sample_value("sessions_assembly_bytes") or 0) >= 7 * 1024 * 1024, 30)
            result = session.append_message(text_message("m1", "t" * 2 * 1024 * 1024))
            assert (result.inserted, result.parent_id) == (True, "held")
            assert _summary(notices) == [("AppendMessage", 1, grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER_BUSY")]
            notices.clear()
            with pytest.raises(SessionsError) as refused:
                session.append_message(text_message("huge", "t" * 9 * 1024 * 1024))
            assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
            assert notices == []
    finally:
        hold.set()
        if sender.is_alive():
            sender.join()
        server.stop()


class _CuttingFront:
    """A gRPC front of a real server that ends the first call of each method CANCELLED (no
    ErrorInfo), as a server's stop ends the calls that reached it, and forwards the others
    byte for byte."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target)
        self._cut: set[str] = set()
        self.calls: list[str] = []
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers([self])
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method  # type: ignore[attr-defined]
        forward = self._channel.unary_unary(method)

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.calls.append(method.rsplit("/", 1)[1])
            if method not in self._cut:
                self._cut.add(method)
                context.abort(grpc.StatusCode.CANCELLED, "the server stopped")
            metadata = [(k, v) for k, v in context.invocation_metadata() if not k.startswith("grpc-")]
            return forward(request, metadata=metadata)  # type: ignore[no-any-return]

        return grpc.unary_unary_rpc_method_handler(handle)

    def close(self) -> None:
        self._server.stop(None)
        self._channel.close()


@pytest.fixture
def cutting_front(live_server: LiveServer) -> Iterator[_CuttingFront]:
    front = _CuttingFront(live_server.address)
    yield front
    front.close()


def test_a_call_the_server_cut_cancelled_is_tried_again_when_safe_to_repeat(
    live_server: LiveServer, cutting_front: _CuttingFront, object_key: str
) -> None:
    """A drain audit: a write that reached a stopping server was ended CANCELLED by gRPC, not
    stored, and not tried again (CANCELLED was taken for the caller's own), so the message was
    lost and the next auto-parent append chained past it. A CANCELLED the client did not make
    is a failure of the connection: a repeatable call is tried again, ClearMessages is not."""
    notices: list[RetryNotice] = []
    with SessionsClient(cutting_front.address, retry=QUICK, on_retry=notices.append) as client:
        session = client.object(object_key).session()
        assert session.append_message(text_message("m1")).inserted
        with pytest.raises(SessionsError) as cut:
            session.clear_messages()
        assert cut.value.code == grpc.StatusCode.CANCELLED
    assert _summary(notices) == [("AppendMessage", 1, grpc.StatusCode.CANCELLED, None)]
    assert cutting_front.calls == ["AppendMessage", "AppendMessage", "ClearMessages"]
    with SessionsClient(live_server.address) as direct:
        assert [m["id"] for m in direct.object(object_key).session().get_history()] == ["m1"]  # not cleared


def test_an_erase_that_may_have_reached_the_server_is_not_repeated(
    live_server: LiveServer, cutting_front: _CuttingFront, object_key: str
) -> None:
    """A repeat of an erase whose answer was lost would also erase what was written since: it is
    asked again only when it never reached the server (the restart test above), not when cut."""
    notices: list[RetryNotice] = []
    with SessionsClient(live_server.address) as direct:
        direct.object(object_key).session().append_message(text_message("m1"))
    with (
        SessionsClient(cutting_front.address, retry=QUICK, on_retry=notices.append) as client,
        pytest.raises(SessionsError) as cut,
    ):
        erase_object(client, object_key)
    assert cut.value.code == grpc.StatusCode.CANCELLED and notices == []
    assert cutting_front.calls == ["DeleteObject"]


def test_the_asyncio_client_tries_a_cut_call_again_but_not_after_its_own_close(
    cutting_front: _CuttingFront, object_key: str
) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    notices: list[RetryNotice] = []

    async def scenario() -> tuple[bool, SessionsError]:
        async with AsyncClient(cutting_front.address, retry=QUICK, on_retry=notices.append) as client:
            inserted = (await client.object(object_key).session().append_message(text_message("m1"))).inserted
        with pytest.raises(SessionsError) as closed:
            await client.object(object_key).session().append_message(text_message("m2"))
        return inserted, closed.value

    inserted, closed = asyncio.run(scenario())
    assert inserted
    assert (closed.code, closed.message) == (grpc.StatusCode.CANCELLED, "the client is closed")
    assert _summary(notices) == [("AppendMessage", 1, grpc.StatusCode.CANCELLED, None)]


PATIENT = RetryPolicy(max_attempts=5, initial_backoff=3600.0, max_backoff=3600.0, multiplier=1.0)


@pytest.mark.parametrize("read", ["unary", "stream"])
def test_a_close_ends_a_wait_to_try_again_and_the_call_raises_closed(dead_address: str, read: str) -> None:
    """A call waiting out a backoff slept through a close() to its end (the client audit: 1-2 s
    after the close, its backoff), then raised: the wait ends at the close now. The close comes
    from another thread at any time during the wait; the call is run on a thread of its own, and
    the test fails if it has not ended long before the hour-long backoff would."""
    client = SessionsClient(dead_address, retry=PATIENT, on_retry=lambda _: threading.Timer(0.05, client.close).start())
    session = client.object("k").session()
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            session.get_message("m") if read == "unary" else session.get_history()
        except BaseException as error:
            outcome.append(error)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=60)
    assert not caller.is_alive(), "the call still waits to go again after the client was closed"
    assert len(outcome) == 1 and isinstance(outcome[0], SessionsError)
    assert (outcome[0].code, outcome[0].message) == (grpc.StatusCode.CANCELLED, "the client is closed")


def test_the_asyncio_client_ends_a_wait_to_try_again_at_a_close(dead_address: str) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    async def scenario() -> SessionsError:
        loop = asyncio.get_running_loop()
        client = AsyncClient(dead_address, retry=PATIENT)
        client.on_retry = lambda _: loop.call_later(0.05, lambda: loop.create_task(client.close()))
        with pytest.raises(SessionsError) as closed:
            await asyncio.wait_for(client.object("k").session().get_message("m"), timeout=60)
        return closed.value

    error = asyncio.run(scenario())
    assert (error.code, error.message) == (grpc.StatusCode.CANCELLED, "the client is closed")
