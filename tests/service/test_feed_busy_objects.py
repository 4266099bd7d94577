"""Change feeds of busy objects, through a real server.

- A subscriber to one session of an object whose other sessions are written more often than
  --progress-seconds got no PROGRESS at all: every other session's event restarted its wait.
  Its resume point never moved on, and clients count a stream that fails after its opening
  PROGRESS alone as a failed attempt, so behind a proxy that cuts connections it gave up.
- A batch of small messages to an object with a reading subscriber, once the process-wide
  retention budget (--feed-retain-total-bytes) was reached, took seconds (3,000 messages: 6.8 s
  instead of 0.14 s), blocking every other object's calls: the budget walked the batch's spared
  events again at each event (counted in tests/storage/test_feed_retention_cost.py). It still
  reaches its subscriber whole.

Every wait is for a call's answer or an event, with GUARD_SECONDS only as a failure guard (the
writes of the busy session are traffic, not synchronisation)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.storage.feed import FeedSettings
from tests.conftest import start_server
from tests.service.support import text_message

GUARD_SECONDS = 20.0
PROGRESS_SECONDS = 0.2
TRAFFIC_SECONDS = 10.0  # how long the busy session is written at most (if no progress comes)


def _append(stub: sessions_pb2_grpc.SessionServiceStub, key: str, message_id: str, session_id: str = "") -> None:
    request = pb.AppendMessageRequest(
        object_key=key, session_id=session_id, message_json=json.dumps(text_message(message_id))
    )
    stub.AppendMessage(request, metadata=routing_metadata(key), timeout=GUARD_SECONDS)


def _append_batch(stub: sessions_pb2_grpc.SessionServiceStub, key: str, prefix: str, count: int, text: str) -> None:
    items = [pb.AppendItem(message_json=json.dumps(text_message(f"{prefix}{index}", text))) for index in range(count)]
    request = pb.AppendMessagesRequest(object_key=key, items=items)
    stub.AppendMessages(request, metadata=routing_metadata(key), timeout=120)


def _subscribe(stub: sessions_pb2_grpc.SessionServiceStub, key: str, session_id: str | None = None) -> Any:
    request = pb.SubscribeRequest(object_key=key)
    if session_id is not None:
        request.session_id = session_id
    feed = stub.Subscribe(request, metadata=routing_metadata(key), timeout=120)
    opening = next(feed)
    assert opening.type == pb.CHANGE_TYPE_PROGRESS
    return feed, opening.revision


def test_a_subscriber_to_a_quiet_session_of_a_busy_object_gets_progress(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", progress_seconds=PROGRESS_SECONDS)
    stop = threading.Event()
    written: list[float] = []

    def busy(stub: sessions_pb2_grpc.SessionServiceStub) -> None:
        # Another session written continuously (each append a millisecond or so: far more often
        # than the progress interval), until the quiet session's progress arrived.
        deadline = time.monotonic() + TRAFFIC_SECONDS
        while not stop.is_set() and time.monotonic() < deadline:
            _append(stub, "busy", f"b{len(written)}", session_id="busy")
            written.append(time.monotonic())

    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            _append(stub, "busy", "first", session_id="busy")
            feed, start = _subscribe(stub, "busy", session_id="quiet")
            writer = threading.Thread(target=busy, args=(stub,), daemon=True)
            started = time.monotonic()
            writer.start()
            try:
                progress = next(feed)
                arrived = time.monotonic()
            finally:
                stop.set()
                writer.join(GUARD_SECONDS)
            feed.cancel()
    finally:
        server.stop()

    assert progress.type == pb.CHANGE_TYPE_PROGRESS, progress
    assert progress.revision > start  # the other session's events moved it on
    # It came about a progress interval in, while the other session was being written (it came
    # only once the writes stopped, TRAFFIC_SECONDS in).
    assert arrived - started < TRAFFIC_SECONDS / 2, arrived - started
    assert len([at for at in written if at < arrived]) >= 10


def test_a_batch_to_an_object_with_a_reading_subscriber_past_the_process_budget_reaches_it_whole(
    tmp_path: Path,
) -> None:
    """The batch is spared for its reader past the budget, and read whole: what it cost is
    counted in tests/storage/test_feed_retention_cost.py (performance is not timed here)."""
    count, text = 4_000, "z" * 400
    server = start_server(tmp_path / "data", feed=FeedSettings(retain_total_bytes=1024 * 1024))
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            _append_batch(stub, "filler", "f", count, text)  # the process budget is reached
            _append(stub, "read", "seed")
            feed = _subscribe(stub, "read")[0]
            _append_batch(stub, "read", "m", count, text)
            _append(stub, "other", "after")  # another object's event, past the budget, meanwhile
            ids = [json.loads(e.message.json)["id"] for e in _events(feed, count)]
            assert ids == [f"m{index}" for index in range(count)]
            feed.cancel()
    finally:
        server.stop()


def _events(feed: Any, count: int) -> list[Any]:
    out = []
    for event in feed:
        if event.type != pb.CHANGE_TYPE_PROGRESS:
            out.append(event)
            if len(out) == count:
                return out
    raise AssertionError(f"the subscription ended after {len(out)} events")
