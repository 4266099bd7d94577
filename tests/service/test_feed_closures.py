"""How a change feed ends when its object goes away, and during a drain.

A subscriber reconnects after UNAVAILABLE either way, but where to: the same server (the object
was replaced: subscribe again and read it anew), the object's new owner (it was removed or moved
away: OBJECT_MOVING, then OBJECT_NOT_OWNED naming it), or another server (this one is stopping:
DRAINING). Subscribers of an object that DeleteObject or ImportObject(replace) closed used to be
told the server was shutting down; a Subscribe whose object was still opening when a drain
began subscribed to a feed nobody closed, and held the drain for all of --drain-seconds.

Every wait is for a call's answer or a condition, with GUARD_SECONDS only as a failure guard.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.storage.paths import object_path
from tests.conftest import start_server
from tests.reliability.support import closed_file_locked
from tests.service.support import text_message

GUARD_SECONDS = 20.0  # a failure guard on waits and calls, never a synchronisation device
DRAIN_SECONDS = 5.0  # what start_server gives a drain


def _append(stub: sessions_pb2_grpc.SessionServiceStub, key: str, message_id: str) -> None:
    request = pb.AppendMessageRequest(object_key=key, session_id="s", message_json=json.dumps(text_message(message_id)))
    stub.AppendMessage(request, metadata=routing_metadata(key), timeout=GUARD_SECONDS)


def _subscribe(stub: sessions_pb2_grpc.SessionServiceStub, key: str) -> Any:
    """A live subscription, once the server has registered it (its first event, a progress)."""
    feed = stub.Subscribe(pb.SubscribeRequest(object_key=key), metadata=routing_metadata(key), timeout=GUARD_SECONDS)
    assert next(feed).type == pb.CHANGE_TYPE_PROGRESS
    return feed


def _end(feed: Any) -> tuple[list[int], SessionsError]:
    """The events a subscription still delivers (types) and the error that ends it."""
    types = []
    try:
        for event in feed:
            types.append(event.type)
    except grpc.RpcError as error:
        return types, SessionsError.from_rpc_error(error)
    raise AssertionError(f"the subscription ended without an error after {types}")


def _wait(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + GUARD_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"not within the guard: {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("closure", ["delete", "replace"])
def test_subscribers_of_an_object_removed_or_replaced_are_told_it_is_moving(
    closure: str, stub: sessions_pb2_grpc.SessionServiceStub, object_key: str
) -> None:
    _append(stub, object_key, "m0")
    feed = _subscribe(stub, object_key)
    metadata = routing_metadata(object_key)
    if closure == "delete":
        request = pb.DeleteObjectRequest(object_key=object_key, moved_to="elsewhere:1")
        assert stub.DeleteObject(request, metadata=metadata, timeout=GUARD_SECONDS).deleted
    else:
        source = f"{object_key}-source"
        _append(stub, source, "i0")
        frames = list(
            stub.ExportObject(
                pb.ExportObjectRequest(object_key=source), metadata=routing_metadata(source), timeout=GUARD_SECONDS
            )
        )
        requests = [pb.ImportObjectRequest(data=f.data, sha256=f.sha256) for f in frames]
        requests[0].object_key, requests[0].replace = object_key, True
        stub.ImportObject(iter(requests), metadata=metadata, timeout=GUARD_SECONDS)

    events, ended = _end(feed)
    assert events == []
    assert (ended.code, ended.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING"), ended
    assert "replaced or removed" in ended.message and "shutting down" not in ended.message

    if closure == "delete":  # where it went is the next subscription's answer
        with pytest.raises(grpc.RpcError) as refused:
            _subscribe(stub, object_key)
        moved = SessionsError.from_rpc_error(refused.value)
        assert (moved.code, moved.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_NOT_OWNED")
        assert "elsewhere:1" in moved.message
    else:  # the server serves the new object, feed included
        again = _subscribe(stub, object_key)
        _append(stub, object_key, "m1")
        event = next(e for e in again if e.type != pb.CHANGE_TYPE_PROGRESS)
        assert event.type == pb.CHANGE_TYPE_APPEND and '"id":"m1"' in event.message.json, event
        again.cancel()


def test_a_drain_ends_the_feeds_of_open_and_of_closed_objects(tmp_path: Path) -> None:
    """One subscriber's object is open; another's was evicted and its file is locked by another
    process, which a subscription does not need (it holds the feed alone). Both end with
    DRAINING, and the drain does not wait out its grace period for either."""
    data_dir = tmp_path / "data"
    server = start_server(data_dir, max_open_objects=1)
    opening_key, open_key = "opening", "open"
    drainer = threading.Thread(target=server.stop, name="drain")
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            _append(stub, opening_key, "m0")
            _append(stub, open_key, "m0")  # `opening` falls out of the LRU: a subscription opens it
            open_feed = _subscribe(stub, open_key)
            with closed_file_locked(object_path(data_dir, opening_key)):
                opening_feed = stub.Subscribe(
                    pb.SubscribeRequest(object_key=opening_key),
                    metadata=routing_metadata(opening_key),
                    timeout=GUARD_SECONDS,
                )
                assert next(opening_feed).type == pb.CHANGE_TYPE_PROGRESS  # subscribed, the file untouched
                began = time.monotonic()
                drainer.start()
                open_events, open_ended = _end(open_feed)  # the drain ended the feeds of open objects
            opening_events, opening_ended = _end(opening_feed)
            drainer.join(GUARD_SECONDS)
            assert not drainer.is_alive()
            drained = time.monotonic() - began
    finally:
        if drainer.ident is None:  # failed before the drain began
            server.stop()
        else:
            drainer.join(GUARD_SECONDS)
    assert open_events == []
    assert (open_ended.code, open_ended.reason) == (grpc.StatusCode.UNAVAILABLE, "DRAINING"), open_ended
    assert "shutting down" in open_ended.message
    assert (opening_ended.code, opening_ended.reason) == (grpc.StatusCode.UNAVAILABLE, "DRAINING"), opening_ended
    assert "shutting down" in opening_ended.message
    assert drained < DRAIN_SECONDS, f"the drain waited {drained:.1f} s for a subscription"
    assert opening_events == []
