"""StreamHistory `max_messages`: at most N messages in the read's order; newest first, the newest
N, read no further (the client's `limit`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import ids, text_message


@pytest.fixture
def transcript(session: Any) -> list[str]:
    """Ten messages, the middle four compacted into a summary, plus a 5 MB message at the leaf."""
    session.append_messages([text_message(f"m{i}") for i in range(10)])
    session.add_compaction("the middle, summarized", "m3", "m6")
    session.append_message(text_message("huge", "h" * 5_000_000))
    return ids(session.get_history())


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 7, 50])
def test_a_limit_keeps_the_first_messages_of_either_order(session: Any, transcript: list[str], limit: int) -> None:
    newest = ids(session.get_history(newest_first=True))
    assert newest == list(reversed(transcript))
    assert ids(session.get_history(newest_first=True, limit=limit)) == newest[:limit]
    assert ids(session.get_history(limit=limit)) == transcript[:limit]
    assert ids(session.history(newest_first=True, limit=limit)) == newest[:limit]
    batches = list(session.history_batches(batch_size=2, newest_first=True, limit=limit))
    assert [id_ for batch in batches for id_ in ids(batch)] == newest[:limit]
    assert all(0 < len(batch) <= 2 for batch in batches)


def test_a_limited_read_carries_a_large_message_whole(session: Any, transcript: list[str]) -> None:
    (leaf,) = session.get_history(newest_first=True, limit=1)
    assert leaf == text_message("huge", "h" * 5_000_000)


def test_a_limited_read_through_a_plain_stub_ends_its_stream(stub: Any, object_key: str, session: Any) -> None:
    session.append_messages([text_message(f"m{i}") for i in range(30)])
    request = pb.StreamHistoryRequest(object_key=object_key, newest_first=True, max_messages=3)
    frames = [response.frame for response in stub.StreamHistory(request)]  # ends by itself
    assert [frame.info.id for frame in frames] == ["m29", "m28", "m27"]


def test_the_client_refuses_a_limit_that_is_not_a_positive_count(session: Any) -> None:
    for limit in (0, -1, 2**32):
        with pytest.raises(ValueError, match="limit"):
            session.get_history(limit=limit)
        with pytest.raises(ValueError, match="limit"):
            next(session.history_batches(limit=limit))


def test_the_asyncio_client_limits_batched_reads(live_server: Any, object_key: str) -> None:
    from sessions_client.aio import SessionsClient

    async def scenario() -> list[list[str]]:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            await session.append_messages([text_message(f"m{i}") for i in range(10)])
            with pytest.raises(ValueError, match="limit"):
                await anext(session.history_batches(limit=0))
            return [ids(batch) async for batch in session.history_batches(batch_size=3, limit=7)]

    assert asyncio.run(scenario()) == [["m0", "m1", "m2"], ["m3", "m4", "m5"], ["m6"]]


def test_a_limited_newest_first_read_answers_in_two_responses(stub: Any, object_key: str, session: Any) -> None:
    """The newest few messages first (the first response comes after a short read), then the rest
    of what was asked together: every response costs the server a write round trip."""
    session.append_messages([text_message(f"m{i}") for i in range(200)])
    request = pb.StreamHistoryRequest(
        object_key=object_key, newest_first=True, max_messages=50, max_messages_per_response=400
    )
    responses = list(stub.StreamHistory(request))
    windows = [[frame.info.id for frame in response.frames] for response in responses]
    assert [id_ for window in windows for id_ in window] == [f"m{i}" for i in range(199, 149, -1)]
    assert [len(window) for window in windows] == [4, 46]
