"""Where a resumed subscription starts, through a real server: a resume point is trusted only as
far as the server can prove it, else the stream says RESET.

- The start of a feed that carried no event was taken for that of an object never written
  whenever the object had no file: but every fresh feed starts so (after a restart, after an
  idle close), and a subscriber to an object erased after that was placed live, never told
  that its messages were gone.
- A feed of an object never written carries events too (a clear or delete that found nothing):
  a resume from its start was placed live, skipping them.
- Revisions are the server's, not an object's alone: two objects' feeds made in the same
  millisecond shared them, and one object's revision resumed on the other mid-stream.
- A revision ahead of the feed's was echoed by the opening PROGRESS, and the RESET after it
  took the stream's revisions backwards.
- So was any revision the feed could not resume from (another object's, a gone feed's, 1): the
  opening PROGRESS read as "resumed after it" to a client keeping it as its place, the RESET
  came after. A resume told RESET now opens with it, as the contract says.

Every wait is for a call's answer or an event, with GUARD_SECONDS only as a failure guard."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from tests.conftest import start_server
from tests.reliability.support import wait_until
from tests.service.support import text_message

GUARD_SECONDS = 20.0
PROGRESS = pb.CHANGE_TYPE_PROGRESS


def _append(stub: sessions_pb2_grpc.SessionServiceStub, key: str, message_id: str, session_id: str = "") -> None:
    request = pb.AppendMessageRequest(
        object_key=key, session_id=session_id, message_json=json.dumps(text_message(message_id))
    )
    stub.AppendMessage(request, metadata=routing_metadata(key), timeout=GUARD_SECONDS)


def _subscribe(stub: sessions_pb2_grpc.SessionServiceStub, key: str, resume_after: int = 0) -> Any:
    return stub.Subscribe(
        pb.SubscribeRequest(object_key=key, resume_after_revision=resume_after),
        metadata=routing_metadata(key),
        timeout=GUARD_SECONDS,
    )


def _opened(stub: sessions_pb2_grpc.SessionServiceStub, key: str, resume_after: int = 0) -> tuple[Any, int]:
    """A subscription once registered, and the revision its opening PROGRESS names."""
    feed = _subscribe(stub, key, resume_after)
    opening = next(feed)
    assert opening.type == PROGRESS, opening
    return feed, opening.revision


def _next_change(feed: Any) -> Any:
    return next(event for event in feed if event.type != PROGRESS)


def _erase(stub: sessions_pb2_grpc.SessionServiceStub, key: str) -> None:
    request = pb.DeleteObjectRequest(object_key=key, erase=True)
    assert stub.DeleteObject(request, metadata=routing_metadata(key), timeout=GUARD_SECONDS).deleted


def _ended(feed: Any) -> SessionsError:
    """The error that ends a subscription (after nothing but progress)."""
    try:
        for event in feed:
            assert event.type == PROGRESS, event
    except grpc.RpcError as error:
        return SessionsError.from_rpc_error(error)
    raise AssertionError("the subscription ended without an error")


def _written_then_restarted(data: Path, key: str) -> Any:
    """A server whose object `key` holds messages and is not open: a restart's first state."""
    before = start_server(data)
    try:
        with grpc.insecure_channel(before.address) as channel:
            for index in range(3):
                _append(sessions_pb2_grpc.SessionServiceStub(channel), key, f"m{index}")
    finally:
        before.stop()
    return start_server(data)


@pytest.fixture
def stub(live_server: Any) -> Iterator[sessions_pb2_grpc.SessionServiceStub]:
    with grpc.insecure_channel(live_server.address) as channel:
        yield sessions_pb2_grpc.SessionServiceStub(channel)


def test_a_resume_from_a_fresh_feeds_start_is_reset_once_the_object_was_erased(tmp_path: Path) -> None:
    """After a restart a written object's feed has carried no event: the subscriber is told its
    start. The object is erased (the stream ends, OBJECT_MOVING); the subscriber resumes from
    that start: its messages are gone, so it must be told RESET, not placed live."""
    key = "erased-after-restart"
    server = _written_then_restarted(tmp_path / "data", key)  # the object's feed starts afresh
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            feed, start = _opened(stub, key)
            _erase(stub, key)
            ended = _ended(feed)
            assert (ended.code, ended.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING"), ended

            resumed = _subscribe(stub, key, resume_after=start)
            _append(stub, key, "after")  # a stream placed live would deliver this first
            first = next(resumed)  # the reset opens the stream: no progress echoing `start`
            assert first.type == pb.CHANGE_TYPE_RESET, first
            assert start < first.revision
            after = _next_change(resumed)
            assert (after.type, json.loads(after.message.json)["id"]) == (pb.CHANGE_TYPE_APPEND, "after")
            resumed.cancel()
    finally:
        server.stop()


def test_a_resume_from_a_never_written_objects_feed_start_gets_the_events_the_feed_carried_since(
    stub: sessions_pb2_grpc.SessionServiceStub, object_key: str
) -> None:
    keeper, _ = _opened(stub, object_key)  # holds the object's feed
    leaver, start = _opened(stub, object_key)
    leaver.cancel()
    metadata = routing_metadata(object_key)
    stub.ClearMessages(pb.ClearMessagesRequest(object_key=object_key, session_id="s"), metadata=metadata)
    stub.DeleteMessages(
        pb.DeleteMessagesRequest(object_key=object_key, session_id="s", message_ids=["x"]), metadata=metadata
    )
    carried = [_next_change(keeper), _next_change(keeper)]
    assert [e.type for e in carried] == [pb.CHANGE_TYPE_CLEAR, pb.CHANGE_TYPE_DELETE]

    resumed, opening = _opened(stub, object_key, resume_after=start)
    _append(stub, object_key, "sentinel")  # a stream placed live would deliver this first
    replayed = [_next_change(resumed) for _ in range(3)]
    assert [(e.type, e.revision) for e in replayed[:2]] == [(e.type, e.revision) for e in carried]
    assert replayed[2].type == pb.CHANGE_TYPE_APPEND
    assert opening == start
    resumed.cancel()
    keeper.cancel()


def test_a_resume_from_the_start_of_a_gone_feed_that_carried_events_is_reset(
    stub: sessions_pb2_grpc.SessionServiceStub, object_key: str
) -> None:
    """As above, but the feed that carried the events is gone with its subscribers (or going:
    while it is still there, the events are replayed, which is as good)."""
    watcher, start = _opened(stub, object_key)
    metadata = routing_metadata(object_key)
    stub.ClearMessages(pb.ClearMessagesRequest(object_key=object_key, session_id="s"), metadata=metadata)
    carried = _next_change(watcher)
    assert carried.type == pb.CHANGE_TYPE_CLEAR
    watcher.cancel()

    resumed = _subscribe(stub, object_key, resume_after=start)
    _append(stub, object_key, "sentinel")  # a stream placed live would deliver this first
    first = next(resumed)
    if first.type == PROGRESS:  # the feed still there: its events are replayed after the opening
        assert first.revision == start
        first = _next_change(resumed)
        assert (first.type, first.revision) == (pb.CHANGE_TYPE_CLEAR, carried.revision), first
    else:
        assert first.type == pb.CHANGE_TYPE_RESET, first
    resumed.cancel()


def test_a_resume_from_a_start_before_a_gone_feed_that_carried_events_is_reset(tmp_path: Path) -> None:
    """A feed of an object never written carried nothing and went (its subscriber gone); a clear
    of the object, still without a file, went through a feed of its own, gone too. A resume from
    the first feed's start was placed where the current feed started, as if nothing could have
    happened since: the clear was skipped for good."""
    server = start_server(tmp_path / "data")
    key = "never-written"
    hubs = server.running.registry._hubs  # each feed goes with its last subscriber
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            feed, start = _opened(stub, key)
            feed.cancel()
            assert wait_until(lambda: key not in hubs, GUARD_SECONDS, interval=0.005)
            clear = pb.ClearMessagesRequest(object_key=key, session_id="s")
            stub.ClearMessages(clear, metadata=routing_metadata(key), timeout=GUARD_SECONDS)
            assert wait_until(lambda: key not in hubs, GUARD_SECONDS, interval=0.005)  # it carried the clear

            resumed = _subscribe(stub, key, resume_after=start)
            first = next(resumed)
            assert first.type == pb.CHANGE_TYPE_RESET, first
            resumed.cancel()
    finally:
        server.stop()


def test_a_resume_ahead_of_the_feed_is_told_reset_first_and_revisions_never_go_back(
    stub: sessions_pb2_grpc.SessionServiceStub, object_key: str
) -> None:
    _append(stub, object_key, "a")
    live, current = _opened(stub, object_key)
    live.cancel()

    resumed = _subscribe(stub, object_key, resume_after=current + (1 << 30))
    first = next(resumed)  # registered: the reset is its first word
    assert (first.type, first.revision) == (pb.CHANGE_TYPE_RESET, current), first
    assert first.error
    _append(stub, object_key, "b")
    seen = [first]
    while seen[-1].type != pb.CHANGE_TYPE_APPEND:
        seen.append(next(resumed))
    revisions = [e.revision for e in seen]
    assert revisions == sorted(revisions) and revisions[-1] > current, seen
    resumed.cancel()


def test_a_revision_of_another_object_is_never_resumed_from(
    stub: sessions_pb2_grpc.SessionServiceStub, object_key: str
) -> None:
    """Objects first written at the same time have feeds made within one millisecond often (once,
    the same epoch, and so the same revisions): a revision of one, resumed on the other, is
    told RESET, whenever their feeds were made."""
    same_millisecond = 0
    for attempt in range(60):
        keys = [f"{object_key}-{attempt}-a", f"{object_key}-{attempt}-b"]
        writers = [threading.Thread(target=_append, args=(stub, key, "first")) for key in keys]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(GUARD_SECONDS)
        feeds = [_opened(stub, key) for key in keys]
        for key, count in zip(keys, (3, 6), strict=True):
            for index in range(count):
                _append(stub, key, f"m{index}")
        revisions = [
            [_next_change(feed).revision for _ in range(count)] for (feed, _), count in zip(feeds, (3, 6), strict=True)
        ]
        for feed, _ in feeds:
            feed.cancel()
        same_millisecond += revisions[0][0] >> 22 == revisions[1][0] >> 22

        for resume_on, foreign in ((keys[1], revisions[0][1]), (keys[0], revisions[1][1])):
            resumed = _subscribe(stub, resume_on, resume_after=foreign)
            first = next(resumed)  # the reset opens the stream: no progress echoing the foreign revision
            assert first.type == pb.CHANGE_TYPE_RESET, (attempt, first)
            resumed.cancel()
        if same_millisecond >= 3:
            break


def _quiet_start(server: Any, stub: sessions_pb2_grpc.SessionServiceStub, key: str) -> int:
    """The start of a feed that carries no event and goes with its only subscriber (the object
    not open): what `session.mirror()` holds after its probe of an object not open."""
    feed, start = _opened(stub, key)
    feed.cancel()
    assert wait_until(lambda: key not in server.running.registry._hubs, GUARD_SECONDS, interval=0.005)
    return start


def test_a_resume_from_a_quiet_feed_of_a_written_object_is_not_reset(tmp_path: Path) -> None:
    """Nothing happened to the object after the subscriber left, and the server ran on: a
    resume is placed where the current feed started, not told RESET (which had a mirror made
    after a restart, or of an object closed while idle, read the whole session again)."""
    key = "quiet"
    server = _written_then_restarted(tmp_path / "data", key)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            start = _quiet_start(server, stub, key)

            resumed, opening = _opened(stub, key, resume_after=start)  # a progress, not a reset
            assert opening >= start  # where the current feed started
            resumed.cancel()

            keeper, _ = _opened(stub, key)  # a feed kept by a subscriber retains its events
            _append(stub, key, "missed")
            replayed, opening = _opened(stub, key, resume_after=start)
            missed = _next_change(replayed)
            assert opening >= start
            assert (missed.type, json.loads(missed.message.json)["id"]) == (pb.CHANGE_TYPE_APPEND, "missed")
            replayed.cancel()
            keeper.cancel()
    finally:
        server.stop()


def test_a_resume_from_a_quiet_feed_start_is_reset_once_the_object_was_erased_with_no_feed(tmp_path: Path) -> None:
    """The object erased and written again while it had no feed at all: no feed carried the
    erase, yet a resume from before it must not be placed live (it would get the new message
    and never learn that the old ones went)."""
    key = "erased-unwatched"
    server = _written_then_restarted(tmp_path / "data", key)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            start = _quiet_start(server, stub, key)
            _erase(stub, key)
            _append(stub, key, "new")

            resumed = _subscribe(stub, key, resume_after=start)
            first = next(resumed)
            assert first.type == pb.CHANGE_TYPE_RESET, first
            resumed.cancel()
    finally:
        server.stop()
