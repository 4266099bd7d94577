"""A subscription follows its object to a new owner (a sharding audit): a move ends the feed
(UNAVAILABLE, OBJECT_MOVING) and the old owner then refuses the key (FAILED_PRECONDITION,
OBJECT_NOT_OWNED) until the proxy routes it to the new one. The clients took that refusal for an
error of the subscription's own and ended it, so events written after a re-shard never came.
They now resume as after a restart, with the RESET a new owner's feed gives.

The proxy here is a gRPC front of two real servers that forwards Subscribe to its `target`, the
shard its ring names, and records how each forwarded stream ended."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status

from sessions_client import ChangeEvent, SessionsClient, SessionsError
from sessions_client.admin import move_object
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.service.support import text_message

SUBSCRIBE = "/sessions.v1.SessionService/Subscribe"


class _RoutingFront:
    """Forwards each Subscribe to the shard `target` names when it arrives, the server's refusals
    (status and details) as they came."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.endings: list[str | None] = []  # the ErrorInfo reason of each forwarded stream's failure
        self.cut_after_first = False  # end the next stream after its first response, as nginx did
        self.streams = 0
        self._channels: dict[str, grpc.Channel] = {}
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers([self])
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != SUBSCRIBE:  # type: ignore[attr-defined]
            return None

        def forward(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            channel = self._channels.setdefault(self.target, grpc.insecure_channel(self.target))
            metadata = [(k, v) for k, v in context.invocation_metadata() if not k.startswith("grpc-")]
            call = channel.unary_stream(SUBSCRIBE)(request, metadata=metadata)
            context.add_callback(call.cancel)
            self.streams += 1
            try:
                for response in call:
                    yield response
                    if self.cut_after_first:
                        break
                else:
                    return
            except grpc.RpcError as error:
                self.endings.append(SessionsError.from_rpc_error(error).reason)
                status = rpc_status.from_call(error)  # type: ignore[arg-type]
                if status is None:
                    context.abort(error.code(), error.details() or "")
                context.abort_with_status(rpc_status.to_status(status))
            self.cut_after_first = False
            call.cancel()
            context.abort(grpc.StatusCode.UNKNOWN, "Stream removed")  # nginx's words for a shard gone under it

        return grpc.unary_stream_rpc_method_handler(forward)

    def close(self) -> None:
        self._server.stop(None)
        for channel in self._channels.values():
            channel.close()


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[tuple[LiveServer, LiveServer, _RoutingFront]]:
    first, second = start_server(tmp_path / "a"), start_server(tmp_path / "b")
    front = _RoutingFront(first.address)
    yield first, second, front
    front.close()
    first.stop()
    second.stop()


def _described(event: ChangeEvent) -> str:
    return f"{event.type} {event.message['id'] if event.message else ''}".strip()


def _move(first: LiveServer, second: LiveServer, front: _RoutingFront) -> None:
    """Moves "k" from the first shard to the second; once the first has refused a resume for it
    (OBJECT_NOT_OWNED), the proxy is told the new ring."""
    with SessionsClient(first.address) as source, SessionsClient(second.address) as destination:
        move_object(source, destination, "k", destination_name=second.address)
    assert wait_until(lambda: "OBJECT_NOT_OWNED" in front.endings, timeout=30), front.endings
    front.target = second.address


def test_a_subscription_follows_its_object_to_its_new_shard(
    shards: tuple[LiveServer, LiveServer, _RoutingFront],
) -> None:
    first, second, front = shards
    with SessionsClient(first.address) as owner:
        owner.object("k").session().append_message(text_message("m0"))
    events: queue.Queue[ChangeEvent | BaseException] = queue.Queue()

    def follow() -> None:
        with SessionsClient(front.address) as client:
            try:
                for event in client.object("k").subscribe(include_progress=True):
                    events.put(event)
                    if _described(event) == "append m1":
                        return
            except BaseException as failure:  # the test's thread reports it
                events.put(failure)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert isinstance(events.get(timeout=30), ChangeEvent)  # subscribed
    _move(first, second, front)

    def next_event() -> str:
        event = events.get(timeout=30)
        assert not isinstance(event, BaseException), f"the subscription ended: {event!r}"
        return _described(event)

    # The new owner's feed is another: the resume is told it may have missed events.
    while next_event() != "reset":
        pass
    with SessionsClient(second.address) as owner:
        owner.object("k").session().append_message(text_message("m1"))
    while next_event() != "append m1":
        pass
    follower.join(timeout=30)
    assert front.endings[:2] == ["OBJECT_MOVING", "OBJECT_NOT_OWNED"]


def test_the_asyncio_client_follows_it_too(shards: tuple[LiveServer, LiveServer, _RoutingFront]) -> None:
    from sessions_client.aio import SessionsClient as AsyncClient

    first, second, front = shards
    with SessionsClient(first.address) as owner:
        owner.object("k").session().append_message(text_message("m0"))

    async def scenario() -> list[str]:
        seen: list[str] = []
        async with AsyncClient(front.address) as client:
            feed = client.object("k").subscribe(include_progress=True)
            await feed.__anext__()  # subscribed
            moved = asyncio.get_running_loop().run_in_executor(None, _move, first, second, front)
            async for event in feed:
                seen.append(_described(event))
                if event.type == "reset":  # resumed on the new owner: write there
                    await moved
                    with SessionsClient(second.address) as owner:
                        owner.object("k").session().append_message(text_message("m1"))
                if seen[-1] == "append m1":
                    break
        return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert seen[-1] == "append m1" and "reset" in seen


def test_a_subscription_to_a_shard_that_keeps_refusing_the_key_ends_once_its_attempts_are_spent(
    shards: tuple[LiveServer, LiveServer, _RoutingFront],
) -> None:
    """Without a proxy that learns the new ring, the refusal comes back each time: the error is
    raised after `reconnect_attempts`, as for a server that never comes back."""
    first, second, front = shards
    with SessionsClient(first.address) as owner:
        owner.object("k").session().append_message(text_message("m0"))
        with SessionsClient(second.address) as destination:
            move_object(owner, destination, "k", destination_name=second.address)
    with SessionsClient(front.address) as client, pytest.raises(SessionsError) as refused:
        for _ in client.object("k").subscribe(reconnect_attempts=2):
            pass
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_NOT_OWNED")
    assert front.endings == ["OBJECT_NOT_OWNED"] * 3


def test_a_subscription_a_proxy_ends_without_the_servers_status_resumes(
    shards: tuple[LiveServer, LiveServer, _RoutingFront],
) -> None:
    """Through nginx, a shard restarting under writes ended most subscriptions UNKNOWN ("Stream
    removed": the stream closed without the server's trailers), and the clients gave up on them."""
    first, _, front = shards
    front.cut_after_first = True
    with SessionsClient(front.address) as client, SessionsClient(first.address) as owner:
        owner.object("k").session().append_message(text_message("m0"))
        feed = client.object("k").subscribe(include_progress=True)
        assert next(feed).type == "progress"  # then cut: UNKNOWN
        owner.object("k").session().append_message(text_message("m1"))
        assert _described(next(e for e in feed if e.type != "progress")) == "append m1"  # resumed, no reset
        feed.close()
    assert front.streams == 2
