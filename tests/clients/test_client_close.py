"""A closed Python client raises SessionsError (CANCELLED, "the client is closed"), as every
other failure: a subscription it cuts ends so instead of trying to reconnect through a closed
channel (ValueError), or ending in a bare CancelledError in a task nobody cancelled (asyncio);
a call made after the close raises it too (ValueError, grpc's UsageError before)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError, aio
from sessions_client._common import Connection
from tests.conftest import LiveServer


def _is_closed_error(error: BaseException | None) -> bool:
    return (
        isinstance(error, SessionsError)
        and error.code == grpc.StatusCode.CANCELLED
        and error.message == "the client is closed"
    )


def test_closing_the_sync_client_ends_its_subscription_and_later_calls(live_server: LiveServer) -> None:
    client = SessionsClient(live_server.address)
    subscribed = threading.Event()
    ended: list[BaseException | None] = []

    def follow() -> None:
        try:
            for _ in client.object("closing").subscribe(include_progress=True):
                subscribed.set()
            ended.append(None)
        except BaseException as error:  # what the subscriber sees is the assertion
            ended.append(error)

    thread = threading.Thread(target=follow)
    thread.start()
    assert subscribed.wait(timeout=30)
    client.close()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert _is_closed_error(ended[0]), ended
    with pytest.raises(SessionsError) as after:
        client.object("closing").session().get_history()
    assert _is_closed_error(after.value)
    with pytest.raises(SessionsError) as unary_after:
        client.object("closing").session().append_message({"id": "m", "role": "user", "parts": []})
    assert _is_closed_error(unary_after.value)


def test_closing_the_asyncio_client_ends_its_subscription_and_later_calls(live_server: LiveServer) -> None:
    async def scenario() -> tuple[BaseException | None, Any, Any]:
        client = aio.SessionsClient(live_server.address)
        subscribed = asyncio.Event()

        async def follow() -> BaseException | None:
            try:
                async for _ in client.object("closing").subscribe(include_progress=True):
                    subscribed.set()
            except BaseException as error:  # what the subscriber sees is the assertion
                return error
            return None

        task = asyncio.create_task(follow())
        await asyncio.wait_for(subscribed.wait(), 30)
        await client.close()
        ended = await asyncio.wait_for(task, 30)
        outcomes = []
        for call in (
            client.object("closing").session().get_history(),
            client.object("closing").session().append_message({"id": "m", "role": "user", "parts": []}),
        ):
            try:
                await call
                outcomes.append(None)
            except BaseException as error:
                outcomes.append(error)
        return ended, outcomes[0], outcomes[1]

    ended, read_after, write_after = asyncio.run(scenario())
    assert _is_closed_error(ended), ended
    assert _is_closed_error(read_after), read_after
    assert _is_closed_error(write_after), write_after


def test_a_channel_passed_in_stays_open_when_the_client_closes(live_server: LiveServer) -> None:
    """It was closed under its owner, as the Go client's WithConn does not."""
    from sessions_proto.v1 import sessions_pb2 as pb
    from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc

    with grpc.insecure_channel(live_server.address) as channel:
        client = SessionsClient("unused", channel=channel)
        client.object("passed").session().append_message({"id": "m", "role": "user", "parts": []})
        client.close()
        with pytest.raises(SessionsError) as after:
            client.object("passed").session().get_history()
        assert _is_closed_error(after.value)
        request = pb.GetMessageRequest(object_key="passed", message_id="m")
        assert len(list(pb_grpc.SessionServiceStub(channel).GetMessage(request))) == 1  # still open


def test_a_call_through_a_channel_its_owner_closed_raises_sessions_error(live_server: LiveServer) -> None:
    """A review: a channel passed in and closed by its owner made a call raise gRPC's own
    ValueError (asyncio: UsageError), and one it cut mid-call, retried as a CANCELLED the client
    did not make, ended the same way. Both clients raise SessionsError (CANCELLED), not retried."""
    channel = grpc.insecure_channel(live_server.address)
    notices: list[Any] = []
    client = SessionsClient(live_server.address, channel=channel, on_retry=notices.append)
    channel.close()
    with pytest.raises(SessionsError) as unary:
        client.object("owned-channel").session().append_message({"id": "m", "role": "user", "parts": []})
    with pytest.raises(SessionsError) as stream:
        client.object("owned-channel").session().get_history()
    for failure in (unary.value, stream.value):
        assert (failure.code, failure.message) == (
            grpc.StatusCode.CANCELLED,
            "the channel the client calls through is closed",
        )
    assert notices == []

    async def scenario() -> list[SessionsError]:
        async_channel = grpc.aio.insecure_channel(live_server.address)
        async_client = aio.SessionsClient(live_server.address, channel=async_channel, on_retry=notices.append)
        await async_channel.close()
        failures = []
        for call in (
            lambda: (
                async_client.object("owned-channel").session().append_message({"id": "m", "role": "user", "parts": []})
            ),
            lambda: async_client.object("owned-channel").session().get_history(),
        ):
            with pytest.raises(SessionsError) as failed:
                await call()
            failures.append(failed.value)
        return failures

    for failure in asyncio.run(scenario()):
        assert (failure.code, failure.message) == (
            grpc.StatusCode.CANCELLED,
            "the channel the client calls through is closed",
        )
    assert notices == []


def test_a_close_is_not_stopped_by_a_wait_whose_event_loop_is_gone() -> None:
    """A wait to try a call again, left pending in an event loop that was then closed: the
    close that ends such waits raised "Event loop is closed", and the channel stayed open
    (review, session 52)."""
    connection = Connection()  # what a client and its views share
    loop = asyncio.new_event_loop()
    waiting = loop.create_task(connection.pause_async(3600))
    loop.run_until_complete(asyncio.sleep(0))  # the wait has begun
    loop.close()
    connection.close()
    assert connection.closed and not waiting.done()  # its loop never runs again
