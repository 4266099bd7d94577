"""A subscription holds its object's feed alone, not the object: subscribers keep no file open
(hundreds of them once held a file each past --max-open-objects, until the server ran out of
descriptors and failed every call INTERNAL), subscribing creates nothing, and an object evicted
under its subscribers is reopened by the next write with its revisions going on.

Every wait is for a call's answer, with GUARD_SECONDS only as a failure guard."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from tests.conftest import LiveServer, start_server
from tests.service.support import files_under, text_message

GUARD_SECONDS = 20.0
MAX_OPEN = 2


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    running = start_server(tmp_path / "data", max_open_objects=MAX_OPEN)
    yield running
    running.stop()


@pytest.fixture
def stub(server: LiveServer) -> Iterator[sessions_pb2_grpc.SessionServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield sessions_pb2_grpc.SessionServiceStub(channel)


def append(stub: sessions_pb2_grpc.SessionServiceStub, key: str, message_id: str) -> None:
    request = pb.AppendMessageRequest(object_key=key, message_json=json.dumps(text_message(message_id)))
    stub.AppendMessage(request, metadata=routing_metadata(key), timeout=GUARD_SECONDS)


def subscribe(stub: sessions_pb2_grpc.SessionServiceStub, key: str, resume_after: int = 0) -> Any:
    """A subscription, once registered (a live one's first event is a progress)."""
    feed = stub.Subscribe(
        pb.SubscribeRequest(object_key=key, resume_after_revision=resume_after),
        metadata=routing_metadata(key),
        timeout=GUARD_SECONDS,
    )
    if not resume_after:
        assert next(feed).type == pb.CHANGE_TYPE_PROGRESS
    return feed


def next_change(feed: Any) -> Any:
    return next(event for event in feed if event.type != pb.CHANGE_TYPE_PROGRESS)


def message_id(event: Any) -> str:
    return str(json.loads(event.message.json)["id"])


def test_subscribers_hold_no_object_open(server: LiveServer, stub: sessions_pb2_grpc.SessionServiceStub) -> None:
    keys = [f"k{i}" for i in range(12)]
    for key in keys:
        append(stub, key, "m0")
    feeds = [subscribe(stub, key) for key in keys]

    assert server.running.registry.open_count <= MAX_OPEN
    for round_ in (1, 2):  # every object evicted and reopened between its rounds
        for key in keys:
            append(stub, key, f"m{round_}")
        assert server.running.registry.open_count <= MAX_OPEN
        for feed in feeds:
            assert message_id(next_change(feed)) == f"m{round_}"
    for feed in feeds:
        feed.cancel()


def test_an_evicted_object_keeps_its_revisions_for_its_subscribers(stub: sessions_pb2_grpc.SessionServiceStub) -> None:
    feed = subscribe(stub, "kept")
    append(stub, "kept", "a")
    first = next_change(feed)
    for key in ("other1", "other2", "other3"):  # evicts `kept`
        append(stub, key, "x")
    append(stub, "kept", "b")
    second = next_change(feed)

    assert (message_id(first), message_id(second)) == ("a", "b")
    assert second.revision > first.revision
    resumed = subscribe(stub, "kept", resume_after=first.revision)  # from before the eviction
    opening = next(resumed)  # where it resumes
    assert (opening.type, opening.revision) == (pb.CHANGE_TYPE_PROGRESS, first.revision)
    assert (resumed_event := next(resumed)).type == pb.CHANGE_TYPE_APPEND
    assert (message_id(resumed_event), resumed_event.revision) == ("b", second.revision)
    feed.cancel()
    resumed.cancel()


def test_subscribing_creates_nothing_and_the_first_write_is_delivered(
    server: LiveServer, stub: sessions_pb2_grpc.SessionServiceStub
) -> None:
    objects = Path(server.data_dir) / "objects"
    before = files_under(objects)
    feed = subscribe(stub, "not-yet")
    assert files_under(objects) == before

    append(stub, "not-yet", "first")
    assert message_id(next_change(feed)) == "first"
    feed.cancel()
