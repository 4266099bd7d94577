"""The summarizer's timeout bounds the whole model call. It was urllib's timeout, which bounds
each socket operation: an endpoint answering a byte at a time held the call (and one of the four
summarizer slots) for as long as it liked. A real HTTP endpoint on loopback.

A call abandoned (its caller cancelled, or out of time) is stopped, its connection closed at
once, and keeps its slot until then: the slot was freed when the caller stopped waiting while the
call's thread went on, so 200 Compacts with 0.3 s deadlines against an endpoint that never
answered held 113 connections open to it at once (125 threads in the server), for 33 s more.
`Endpoint` here counts the connections open to it."""

from __future__ import annotations

import asyncio
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_server.integrations.chat_completions import CALLS_AT_ONCE, ChatCompletionsSummarizer, SummarizerError
from tests.conftest import start_server
from tests.service.chat_completions_stub import DRIP, DRIP_PAUSE, FAIL, GUARD_SECONDS, ChatCompletionsStub
from tests.service.test_compaction_summarizer import turn

PROMPTLY = 5.0  # an abandoned call's connection is closed within milliseconds; this bounds the wait
TRICKLE_PAUSE = 0.05


def test_an_endpoint_answering_a_byte_at_a_time_runs_out_of_time(llm: ChatCompletionsStub) -> None:
    llm.mode = DRIP  # every byte comes well within a socket timeout; the answer takes seconds
    summarizer = ChatCompletionsSummarizer(llm.url, "model", timeout_seconds=DRIP_PAUSE * 5)

    with pytest.raises(SummarizerError, match=r"timed out: no answer within 0\.5 s"):
        asyncio.run(summarizer.summarize("prompt"))
    assert len(llm.requests) == 1


def test_an_endpoint_answering_in_time_is_heard(llm: ChatCompletionsStub) -> None:
    summarizer = ChatCompletionsSummarizer(llm.url, "model", timeout_seconds=30)

    assert asyncio.run(summarizer.summarize("prompt")) == "summary #1"


class _Peer:
    def __init__(self, number: int) -> None:
        self.number = number
        self.received = b""
        self.request: bytes | None = None
        self.trickled = False


class Endpoint:
    """A chat-completions endpoint on 127.0.0.1 counting the connections open to it. It reads
    each request whole; connections numbered `answer_from` or later (from 1) are answered
    `summary` and closed, the others never: they stay open until the client closes them, sent
    nothing (`trickle=False`) or a response line that never ends, a byte every TRICKLE_PAUSE,
    which no socket timeout ends (`trickle=True`). One thread serves it all and, in each round,
    sees connections closed before it accepts new ones, so a connection the client closed before
    opening the next is counted closed first."""

    def __init__(self, *, answer_from: int | None = None, trickle: bool = False) -> None:
        self.answer_from = answer_from
        self.trickle = trickle
        self.accepted = 0
        self.closed = 0
        self.peak = 0
        self.open_at_accept: list[int] = []  # for each connection, how many others were open then
        self.requests: list[bytes] = []
        self._changed = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="endpoint", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    @property
    def open(self) -> int:
        return self.accepted - self.closed

    def __repr__(self) -> str:
        return f"Endpoint(accepted={self.accepted}, open={self.open}, peak={self.peak})"

    def wait_until(self, condition: Callable[[], bool], timeout: float = GUARD_SECONDS) -> bool:
        with self._changed:
            return self._changed.wait_for(condition, timeout)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(GUARD_SECONDS)
        for key in list(self._selector.get_map().values()):
            cast(socket.socket, key.fileobj).close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            events = self._selector.select(TRICKLE_PAUSE)
            events.sort(key=lambda event: event[0].data is None)  # connections first, the listener last
            for key, _ in events:
                if key.data is None:
                    self._accept()
                else:
                    self._read(cast(socket.socket, key.fileobj), key.data)
            if self.trickle:
                for key in list(self._selector.get_map().values()):
                    peer = key.data
                    if peer is not None and peer.request is not None:
                        self._send(
                            cast(socket.socket, key.fileobj), b"." if peer.trickled else b"HTTP/1.1 200 OK\r\nX-W: "
                        )
                        peer.trickled = True

    def _accept(self) -> None:
        # One connection a round: it asked before this round's select, and so did a client's
        # close sent before it, which this round reads first. Taking every connection waiting,
        # some asked after the select, while the close before them went unread till the next
        # round, and counted open together they made a peak the client never had.
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        with self._changed:
            self.open_at_accept.append(self.open)
            self.accepted += 1
            self.peak = max(self.peak, self.open)
            self._changed.notify_all()
        conn.setblocking(False)
        self._selector.register(conn, selectors.EVENT_READ, _Peer(self.accepted))

    def _read(self, conn: socket.socket, peer: _Peer) -> None:
        # Everything the socket holds, its end included: a client that sent its request and
        # closed at once is then counted closed in this round, before a connection accepted in
        # it (read a piece at a time, its end came a round later, after the next accept).
        data, ended = b"", False
        while True:
            try:
                piece = conn.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                piece = b""
            if not piece:
                ended = True
                break
            data += piece
        peer.received += data
        self._take_request(conn, peer)
        if ended:
            self._close(conn)

    def _take_request(self, conn: socket.socket, peer: _Peer) -> None:
        head, separator, body = peer.received.partition(b"\r\n\r\n")
        if peer.request is not None or not separator:
            return
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        if len(body) < length:
            return
        peer.request = peer.received
        with self._changed:
            self.requests.append(peer.request)
            self._changed.notify_all()
        if self.answer_from is not None and peer.number >= self.answer_from:
            reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": "summary"}}]}).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(reply)
            self._send(conn, head + reply)
            self._close(conn)

    def _send(self, conn: socket.socket, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError:
            self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        if conn.fileno() == -1:
            return
        self._selector.unregister(conn)
        conn.close()
        with self._changed:
            self.closed += 1
            self._changed.notify_all()


@pytest.fixture
def endpoint() -> Iterator[Callable[..., Endpoint]]:
    started: list[Endpoint] = []

    def start(*, answer_from: int | None = None, trickle: bool = False) -> Endpoint:
        started.append(Endpoint(answer_from=answer_from, trickle=trickle))
        return started[-1]

    yield start
    for each in started:
        each.stop()


def at_least(count: Callable[[], int], wanted: int) -> Callable[[], bool]:
    return lambda: count() >= wanted


async def until(endpoint: Endpoint, condition: Callable[[], bool], timeout: float = GUARD_SECONDS) -> bool:
    return await asyncio.to_thread(endpoint.wait_until, condition, timeout)


def test_cancelled_calls_close_their_connections_and_free_their_slots_only_then(
    endpoint: Callable[..., Endpoint],
) -> None:
    """Wave after wave of calls cancelled while the model says nothing: each wave's connections
    are closed at once, and the next wave connects only after."""
    silent = endpoint()
    summarizer = ChatCompletionsSummarizer(silent.url, "model", timeout_seconds=GUARD_SECONDS * 4)  # only cancelled
    waves = 5

    async def run() -> None:
        calls = [asyncio.create_task(summarizer.summarize(f"prompt {n}")) for n in range(CALLS_AT_ONCE * waves)]
        try:
            for wave in range(waves):
                connected = CALLS_AT_ONCE * (wave + 1)
                assert await until(silent, at_least(lambda: len(silent.requests), connected)), silent
                for call in calls[connected - CALLS_AT_ONCE : connected]:  # the slots go first come, first served
                    call.cancel()
                assert await until(silent, at_least(lambda: silent.closed, connected), PROMPTLY), (
                    f"connections of cancelled calls still open: {silent}"
                )
        finally:
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)

    asyncio.run(run())
    assert silent.wait_until(lambda: silent.open == 0, PROMPTLY), silent
    assert silent.peak <= CALLS_AT_ONCE, silent
    assert silent.accepted == len(silent.requests) == CALLS_AT_ONCE * waves


def test_calls_out_of_time_fail_as_before_and_hold_no_connection(endpoint: Callable[..., Endpoint]) -> None:
    """The endpoint sends a response line a byte at a time, for ever: no socket timeout ends
    that, only the call's own."""
    trickling = endpoint(trickle=True)
    summarizer = ChatCompletionsSummarizer(trickling.url, "model", timeout_seconds=0.5)

    async def run() -> list[BaseException | str]:
        return await asyncio.gather(
            *(summarizer.summarize("prompt") for _ in range(3 * CALLS_AT_ONCE)), return_exceptions=True
        )

    outcomes = asyncio.run(run())
    assert [str(outcome) for outcome in outcomes] == ["summarizer timed out: no answer within 0.5 s"] * len(outcomes)
    assert all(isinstance(outcome, SummarizerError) for outcome in outcomes)
    assert len(trickling.requests) >= CALLS_AT_ONCE
    assert trickling.wait_until(lambda: trickling.open == 0, PROMPTLY), f"abandoned connections still open: {trickling}"
    assert trickling.peak <= CALLS_AT_ONCE, trickling


def test_the_wait_for_a_slot_counts_against_the_timeout(endpoint: Callable[..., Endpoint]) -> None:
    """Four calls the model never answers hold every slot; a fifth, with a short timeout, fails
    when that runs out instead of waiting for a slot (as long as the others' timeout)."""
    silent = endpoint()
    holding = ChatCompletionsSummarizer(silent.url, "model", timeout_seconds=GUARD_SECONDS * 4)
    waiting = ChatCompletionsSummarizer(silent.url, "model", timeout_seconds=0.5, _slots=holding._slots)

    async def run() -> None:
        held = [asyncio.create_task(holding.summarize("prompt")) for _ in range(CALLS_AT_ONCE)]
        try:
            assert await until(silent, lambda: len(silent.requests) >= CALLS_AT_ONCE), silent
            with pytest.raises(SummarizerError, match=r"^summarizer timed out: no answer within 0\.5 s$"):
                try:
                    await asyncio.wait_for(waiting.summarize("prompt"), PROMPTLY)
                except TimeoutError:
                    pytest.fail(f"a call with a 0.5 s timeout still waited for a slot after {PROMPTLY:g} s")
        finally:
            for call in held:
                call.cancel()
            await asyncio.gather(*held, return_exceptions=True)

    asyncio.run(run())
    assert silent.accepted == CALLS_AT_ONCE, silent  # the fifth never reached the model
    assert silent.wait_until(lambda: silent.open == 0, PROMPTLY), silent


def test_a_call_after_cancelled_ones_is_answered_on_a_connection_of_its_own(endpoint: Callable[..., Endpoint]) -> None:
    """The four connections the endpoint never answers are cancelled; the next call gets a slot
    once one of them is closed, and its answer."""
    answering_fifth = endpoint(answer_from=CALLS_AT_ONCE + 1)
    summarizer = ChatCompletionsSummarizer(answering_fifth.url, "model-x", timeout_seconds=GUARD_SECONDS * 4)

    async def run() -> str:
        held = [asyncio.create_task(summarizer.summarize("held")) for _ in range(CALLS_AT_ONCE)]
        assert await until(answering_fifth, lambda: len(answering_fifth.requests) >= CALLS_AT_ONCE), answering_fifth
        for call in held:
            call.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        return await asyncio.wait_for(summarizer.summarize("the prompt"), GUARD_SECONDS)

    assert asyncio.run(run()) == "summary"
    assert answering_fifth.accepted == CALLS_AT_ONCE + 1
    assert answering_fifth.open_at_accept[CALLS_AT_ONCE] < CALLS_AT_ONCE, answering_fifth.open_at_accept
    request = answering_fifth.requests[CALLS_AT_ONCE]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    body = json.loads(request.partition(b"\r\n\r\n")[2])
    assert body == {"model": "model-x", "messages": [{"role": "user", "content": "the prompt"}]}
    assert answering_fifth.wait_until(lambda: answering_fifth.open == 0, PROMPTLY), answering_fifth


def test_compacts_past_their_deadline_hold_no_more_model_calls_than_the_slots(
    tmp_path: Path, endpoint: Callable[..., Endpoint]
) -> None:
    """The auditor's case, through a server: Compacts with 0.3 s deadlines against a model that
    never answers."""
    silent = endpoint()
    server = start_server(
        tmp_path / "data",
        summarizer_url=silent.url,
        summarizer_model="m",
        summarizer_timeout_seconds=GUARD_SECONDS * 4,  # only the callers' deadlines end the calls
    )
    try:
        with SessionsClient(server.address) as client:
            session = client.object("deadlines").session()
            session.append_messages([turn(i) for i in range(12)])
            session.set_compaction_policy(0, keep_recent_tokens=1)
            hurried = client.with_options(timeout=0.3, retry=None).object("deadlines").session()
            codes: list[grpc.StatusCode] = []

            def compact_five_times() -> None:
                for _ in range(5):
                    try:
                        hurried.compact()
                    except SessionsError as exc:
                        codes.append(exc.code)

            callers = [threading.Thread(target=compact_five_times) for _ in range(2 * CALLS_AT_ONCE)]
            started = time.monotonic()
            for caller in callers:
                caller.start()
            for caller in callers:
                caller.join(GUARD_SECONDS)
            assert time.monotonic() - started < GUARD_SECONDS
            assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * (10 * CALLS_AT_ONCE)
            assert silent.wait_until(lambda: silent.open == 0, PROMPTLY), f"abandoned model calls still open: {silent}"
            assert silent.accepted >= CALLS_AT_ONCE and silent.peak <= CALLS_AT_ONCE, silent
    finally:
        server.stop()


def test_a_proxy_in_the_environment_is_used_as_urllib_used_it(
    endpoint: Callable[..., Endpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not new: urllib sent an http request to `http_proxy` whole, unless `no_proxy` named its
    host (it read them at a process's first request, where this reads them at each: a server's
    environment does not change)."""
    proxy, direct = endpoint(answer_from=1), endpoint(answer_from=1)
    monkeypatch.setenv("http_proxy", proxy.url.removesuffix("/v1"))
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
    for name in ("HTTP_PROXY", "NO_PROXY", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)

    assert asyncio.run(ChatCompletionsSummarizer("http://model.invalid/v1/", "m").summarize("p")) == "summary"
    (request,) = proxy.requests
    assert request.startswith(b"POST http://model.invalid/v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nHost: model.invalid\r\n" in request

    assert asyncio.run(ChatCompletionsSummarizer(direct.url, "m").summarize("p")) == "summary"
    (request,) = direct.requests
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert len(proxy.requests) == 1


def test_a_query_in_the_base_url_stays_after_the_path(endpoint: Callable[..., Endpoint]) -> None:
    """An endpoint that takes its API version as a query (`.../v1?api-version=...`) was sent
    `/v1?api-version=.../chat/completions`: the path cut short and the query spoilt."""
    direct = endpoint(answer_from=1)
    summarizer = ChatCompletionsSummarizer(direct.url + "/?api-version=2024-06-01", "m")
    assert asyncio.run(summarizer.summarize("p")) == "summary"
    (request,) = direct.requests
    assert request.startswith(b"POST /v1/chat/completions?api-version=2024-06-01 HTTP/1.1\r\n")


def test_a_refusal_quotes_what_the_endpoint_said() -> None:
    """A 400 for a prompt past the model's context, a 401 for a wrong key and a 404 for a wrong
    model all read "summarizer answered HTTP 4xx" and nothing else."""
    llm = ChatCompletionsStub().start()
    try:
        llm.mode = FAIL
        with pytest.raises(SummarizerError) as failed:
            asyncio.run(ChatCompletionsSummarizer(llm.url, "m").summarize("p"))
        assert str(failed.value) == "summarizer answered HTTP 500: stub failure"
        with pytest.raises(SummarizerError) as failed:
            asyncio.run(ChatCompletionsSummarizer(llm.url + "/wrong", "m").summarize("p"))
        assert str(failed.value) == "summarizer answered HTTP 404: not found"
    finally:
        llm.stop()
