"""Subscribe's reconnect budget (`reconnect_attempts`: failures in a row) against a proxy that
accepts every stream and fails it soon after. The server opens every Subscribe stream with a
PROGRESS event (the "subscribed" acknowledgement), so that event alone is no sign the stream
worked: a stream counts as progress, and resets the count (and the backoff), only once it
delivers something more, a second PROGRESS (it lived a progress interval) or any other event.
Counting the acknowledgement made the client reconnect forever at its shortest backoff.

The server sends that acknowledgement on every stream, a resumed one's at the revision it
resumes after (before, only a stream that started live had one: a resumed stream that lived an
interval and was cut after its first PROGRESS counted as a failure). `FailingRelay` stands
between the client and a real server: it relays Subscribe streams and fails the first `failing`
of them with UNAVAILABLE at a chosen point."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client import aio as sessions_aio
from sessions_client._common import OBJECT_KEY_HEADER
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import LiveServer, start_server

FOREVER = 1 << 30


class FailingRelay(pb_grpc.SessionServiceServicer):
    """A gRPC proxy on a loopback port implementing only Subscribe: each stream goes to the real
    server at `target`; stream n (from 1) is failed UNAVAILABLE, while n <= `failing`, as soon as
    the change types it forwarded satisfy `cut`; later ones are relayed whole. Streams past
    `limit` are refused FAILED_PRECONDITION (not a reason to reconnect), so that a client that
    would reconnect forever fails a test at once. `streams` records, per stream, the change types
    it forwarded."""

    def __init__(
        self,
        target: str,
        *,
        cut: Callable[[list[str]], bool],
        failing: int = FOREVER,
        limit: int = FOREVER,
        cut_after_seconds: float | None = None,
        forgetful: bool = False,
    ) -> None:
        self.cut = cut
        # Each stream resumes from revision 1, unknown to every feed: as after a server that
        # restarted since the client's last revision, the stream opens with RESET.
        self.forgetful = forgetful
        self.cut_after_seconds = cut_after_seconds  # or at the first event forwarded this long after it opened
        self.failing = failing
        self.limit = limit
        self.streams: list[list[str]] = []
        self._lock = threading.Lock()
        self._upstream = grpc.insecure_channel(target)
        self._stub = pb_grpc.SessionServiceStub(self._upstream)
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_SessionServiceServicer_to_server(self, self._server)
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(None).wait(30)
        self._upstream.close()

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.streams)

    def Subscribe(self, request: pb.SubscribeRequest, context: grpc.ServicerContext) -> Iterator[pb.SubscribeResponse]:
        opened = time.monotonic()
        forwarded: list[str] = []
        with self._lock:
            self.streams.append(forwarded)
            fails = len(self.streams) <= self.failing
            refused = len(self.streams) > self.limit
        if refused:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "relay: too many Subscribe streams")
        routing = [(k, v) for k, v in context.invocation_metadata() if k == OBJECT_KEY_HEADER]
        if self.forgetful:
            request.resume_after_revision = 1
        upstream = self._stub.Subscribe(request, metadata=routing)
        try:
            for response in upstream:
                forwarded.append(pb.ChangeType.Name(response.type))
                yield response
                late = self.cut_after_seconds is not None and time.monotonic() - opened >= self.cut_after_seconds
                if fails and (self.cut(forwarded) or late):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "relay: the backend went away")
        finally:
            upstream.cancel()


@pytest.fixture
def relay_to(live_server: LiveServer) -> Iterator[Any]:
    """Makes FailingRelays (to the shared live server unless told another target); closes them."""
    made: list[FailingRelay] = []

    def make(
        *,
        cut: Callable[[list[str]], bool],
        failing: int = FOREVER,
        limit: int = FOREVER,
        target: str | None = None,
        cut_after_seconds: float | None = None,
        forgetful: bool = False,
    ) -> FailingRelay:
        relay = FailingRelay(
            target or live_server.address,
            cut=cut,
            failing=failing,
            limit=limit,
            cut_after_seconds=cut_after_seconds,
            forgetful=forgetful,
        )
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.close()


@pytest.fixture(scope="module")
def chatty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real server whose idle feeds send PROGRESS every 50 ms, so a stream lives long enough
    to deliver a second one at once."""
    server = start_server(tmp_path_factory.mktemp("chatty"), progress_seconds=0.05)
    yield server
    server.stop()


def text_message(message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": f"text of {message_id}"}]}


ATTEMPTS = 2
PROGRESS = "CHANGE_TYPE_PROGRESS"
APPEND = "CHANGE_TYPE_APPEND"


def after_one(forwarded: list[str]) -> bool:
    return len(forwarded) >= 1


def after_two(forwarded: list[str]) -> bool:
    return len(forwarded) >= 2


def after_an_event(forwarded: list[str]) -> bool:
    return forwarded[-1] != PROGRESS


def test_streams_failed_after_their_acknowledgement_use_up_the_attempts(relay_to: Any, object_key: str) -> None:
    """Every stream delivers the server's opening PROGRESS, then fails: the subscription gives up
    with UNAVAILABLE after `reconnect_attempts` reconnections (attempts + 1 streams). Before, each
    acknowledgement reset the count and it reconnected forever, some 10 streams a second."""
    relay = relay_to(cut=after_one, limit=ATTEMPTS + 3)
    with SessionsClient(relay.address) as client:
        events = client.object(object_key).subscribe(include_progress=True, reconnect_attempts=ATTEMPTS)
        seen: list[str] = []
        with pytest.raises(SessionsError) as caught:
            for event in events:
                seen.append(event.type)
                assert len(seen) <= ATTEMPTS + 1, f"still reconnecting after {relay.calls} streams"
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert "relay: the backend went away" in caught.value.message
    assert seen == ["progress"] * (ATTEMPTS + 1)
    assert relay.streams == [[PROGRESS]] * (ATTEMPTS + 1)


def test_aio_streams_failed_after_their_acknowledgement_use_up_the_attempts(relay_to: Any, object_key: str) -> None:
    relay = relay_to(cut=after_one, limit=ATTEMPTS + 3)

    async def scenario() -> tuple[list[str], SessionsError]:
        seen: list[str] = []
        async with sessions_aio.SessionsClient(relay.address) as client:
            events = client.object(object_key).subscribe(include_progress=True, reconnect_attempts=ATTEMPTS)
            with pytest.raises(SessionsError) as caught:
                async for event in events:
                    seen.append(event.type)
                    assert len(seen) <= ATTEMPTS + 1, f"still reconnecting after {relay.calls} streams"
        return seen, caught.value

    seen, error = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert seen == ["progress"] * (ATTEMPTS + 1)
    assert relay.streams == [[PROGRESS]] * (ATTEMPTS + 1)


def test_streams_that_open_with_a_reset_and_fail_use_up_the_attempts(relay_to: Any, object_key: str) -> None:
    """A resume the server cannot place opens with RESET instead of PROGRESS: a server that
    fails every stream after that opening (restarting again and again) must use up the attempts
    as after a PROGRESS. A review: the clients took only a PROGRESS for the opening, so each
    RESET reset the count and the subscription reconnected forever."""
    relay = relay_to(cut=after_one, limit=ATTEMPTS + 3, forgetful=True)
    with SessionsClient(relay.address) as client:
        events = client.object(object_key).subscribe(resume_from=1, reconnect_attempts=ATTEMPTS)
        seen: list[str] = []
        with pytest.raises(SessionsError) as caught:
            for event in events:
                seen.append(event.type)
                assert len(seen) <= ATTEMPTS + 1, f"still reconnecting after {relay.calls} streams"
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert seen == ["reset"] * (ATTEMPTS + 1)
    assert relay.streams == [["CHANGE_TYPE_RESET"]] * (ATTEMPTS + 1)

    async def asynchronously() -> list[str]:
        relay.streams.clear()
        async_seen: list[str] = []
        async with sessions_aio.SessionsClient(relay.address) as async_client:
            feed = async_client.object(object_key).subscribe(resume_from=1, reconnect_attempts=ATTEMPTS)
            with pytest.raises(SessionsError):
                async for event in feed:
                    async_seen.append(event.type)
                    assert len(async_seen) <= ATTEMPTS + 1, f"still reconnecting after {relay.calls} streams"
        return async_seen

    relay.limit = 2 * (ATTEMPTS + 3)
    assert asyncio.run(asyncio.wait_for(asynchronously(), 60)) == ["reset"] * (ATTEMPTS + 1)


def test_without_progress_events_the_subscription_still_gives_up(relay_to: Any, object_key: str) -> None:
    """The same with PROGRESS dropped (the default): the caller sees no event, only the error."""
    relay = relay_to(cut=after_one, limit=ATTEMPTS + 3)
    with SessionsClient(relay.address) as client:
        events = client.object(object_key).subscribe(reconnect_attempts=1)
        with pytest.raises(SessionsError) as caught:
            next(events)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert relay.calls == 2


FAILING = 2 * ATTEMPTS + 1  # more failures than the attempts allow in a row


def test_a_stream_that_lived_a_progress_interval_resets_the_attempts(
    relay_to: Any, chatty_server: LiveServer, object_key: str
) -> None:
    """Streams cut after their second PROGRESS (they lived a progress interval), more of them
    than `reconnect_attempts`: each counts as progress, so a long-lived subscription that is cut
    now and then keeps reconnecting, and goes on on the stream that stays."""
    relay = relay_to(cut=after_two, failing=FAILING, target=chatty_server.address)
    with SessionsClient(relay.address) as client:
        events = client.object(object_key).subscribe(include_progress=True, reconnect_attempts=ATTEMPTS)
        for _ in events:
            if relay.calls > FAILING and len(relay.streams[-1]) >= 3:
                break  # the stream that stays has delivered three PROGRESS events
        events.close()
    assert relay.calls == FAILING + 1
    assert relay.streams[:FAILING] == [[PROGRESS] * 2] * FAILING


def test_aio_a_stream_that_lived_a_progress_interval_resets_the_attempts(
    relay_to: Any, chatty_server: LiveServer, object_key: str
) -> None:
    relay = relay_to(cut=after_two, failing=FAILING, target=chatty_server.address)

    async def scenario() -> None:
        async with sessions_aio.SessionsClient(relay.address) as client:
            events = client.object(object_key).subscribe(include_progress=True, reconnect_attempts=ATTEMPTS)
            async for _ in events:
                if relay.calls > FAILING and len(relay.streams[-1]) >= 3:
                    break
            await events.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert relay.calls == FAILING + 1
    assert relay.streams[:FAILING] == [[PROGRESS] * 2] * FAILING


def test_a_stream_that_delivered_an_event_resets_the_attempts(
    relay_to: Any, client: SessionsClient, object_key: str
) -> None:
    """Streams cut right after their first event that is not a PROGRESS, more of them than
    `reconnect_attempts`: each delivers its opening PROGRESS and an append (the first one's made
    when that PROGRESS arrived, each later one's, on a stream resumed after the last revision,
    when the previous append arrived). Every append arrives and the subscription goes on."""
    relay = relay_to(cut=after_an_event, failing=FAILING)
    session = client.object(object_key).session("s")
    written: list[str] = []
    received: list[str] = []

    def write_next() -> None:
        written.append(f"m{len(written)}")
        session.append_message(text_message(written[-1]))

    with SessionsClient(relay.address) as through_relay:
        events = through_relay.object(object_key).subscribe(include_progress=True, reconnect_attempts=ATTEMPTS)
        for event in events:
            if event.type == "progress":  # a stream's opening; the first stream's: the feed is live
                if not written:
                    write_next()
                continue
            assert event.message is not None
            received.append(event.message["id"])
            if len(received) == FAILING + 1:
                break  # the last one came on the stream that stays
            write_next()
        events.close()
    assert received == written
    assert relay.streams == [[PROGRESS, APPEND]] * (FAILING + 1)


def test_a_resumed_stream_that_lived_a_progress_interval_resets_the_attempts(
    relay_to: Any, tmp_path_factory: pytest.TempPathFactory, object_key: str
) -> None:
    """The object written, each reconnection resumes after its revision. Streams cut at their
    first event a progress interval after they opened, more of them than `reconnect_attempts`:
    each lived an interval, so the subscription keeps reconnecting. A resumed stream sent no
    opening PROGRESS then, so its first, a progress interval later, was taken for one, and the
    subscription gave up."""
    server = start_server(tmp_path_factory.mktemp("interval"), progress_seconds=0.5)
    try:
        with SessionsClient(server.address) as writer:
            writer.object(object_key).session().append_message(text_message("m0"))
        relay = relay_to(cut=lambda forwarded: False, failing=FAILING, target=server.address, cut_after_seconds=0.4)
        with SessionsClient(relay.address) as client:
            events = client.object(object_key).subscribe(include_progress=True, reconnect_attempts=ATTEMPTS)
            for _ in events:
                if relay.calls > FAILING:
                    break  # the stream that stays has delivered its opening PROGRESS
            events.close()
        assert relay.calls == FAILING + 1
        assert relay.streams[:FAILING] == [[PROGRESS] * 2] * FAILING
    finally:
        server.stop()
