"""Subscribe, the change feed (reference notes §9, DESIGN.md §6, issue 8), tested against etcd's
watch guarantees: ordered (revisions strictly increase, events in commit order across writers),
unique (every acknowledged write exactly once), atomic (a batch's events are adjacent), reliable
(no gap without a `reset`), resumable, and with progress notifications when idle. Payloads follow
upstream's listener events.

Every subscription is consumed on its own thread and handed over through a queue. A live
subscription's first event is the server's "progress" event, which is sent only once the
subscription is registered, so waiting for it (never a sleep) makes every later write visible.
Assertions that an operation emits *nothing* write a sentinel afterwards and require that the
sentinel's event is the next one.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import AUTO, ImportItem, SessionsClient, SessionsError
from sessions_client._common import ChangeEvent, EventAssembler, routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.storage.feed import FeedSettings
from tests.service.support import message_rows, object_file, text_message

GUARD_SECONDS = 30.0  # a failure guard on queue reads, never a synchronisation device
_END = object()


class Feed:
    """One subscription on its own client and thread; events arrive through `events`."""

    def __init__(
        self,
        address: str,
        object_key: str,
        *,
        on_event: Callable[[ChangeEvent], None] | None = None,
        **options: Any,
    ) -> None:
        self.client = SessionsClient(address)
        self.live = options.get("resume_from") is None
        options.setdefault("reconnect_attempts", 0)
        self._iterator = self.client.object(object_key).subscribe(include_progress=True, **options)
        self._on_event = on_event
        self.events: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=self._pump, name="feed-pump", daemon=True)
        self.thread.start()
        self.start_revision = 0
        if self.live:
            first = self.get()
            assert isinstance(first, ChangeEvent) and first.type == "progress", first
            self.start_revision = first.revision

    def _pump(self) -> None:
        try:
            for event in self._iterator:
                if self._on_event is not None:
                    self._on_event(event)
                self.events.put(event)
        except BaseException as error:  # handed to the test thread
            self.events.put(error)
        finally:
            self.events.put(_END)

    def get(self, deadline: float | None = None) -> Any:
        """The next item as pumped: a ChangeEvent, an exception, or _END."""
        if deadline is None:
            deadline = time.monotonic() + GUARD_SECONDS
        try:
            return self.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no feed event within {GUARD_SECONDS} s") from None

    def next(self, *, progress: bool = False) -> ChangeEvent:
        """The next event (progress events skipped unless asked for); raises a stream error."""
        deadline = time.monotonic() + GUARD_SECONDS  # skipped progress events do not extend it
        while True:
            item = self.get(deadline)
            if isinstance(item, BaseException):
                raise item
            if item is _END:
                raise AssertionError("the subscription ended")
            if item.type == "progress" and not progress:
                continue
            return item  # type: ignore[no-any-return]

    def take(self, count: int) -> list[ChangeEvent]:
        return [self.next() for _ in range(count)]

    def until(self, predicate: Callable[[ChangeEvent], bool]) -> list[ChangeEvent]:
        """Events up to and including the first that satisfies `predicate`."""
        out = []
        while True:
            event = self.next()
            out.append(event)
            if predicate(event):
                return out

    def close(self) -> None:
        self.client.close()  # cancels the call; the pump thread ends
        self.thread.join(timeout=GUARD_SECONDS)


@pytest.fixture
def feeds(live_server: Any, object_key: str) -> Iterator[Callable[..., Feed]]:
    """Opens subscriptions on the test's object (or another key); closes them all afterwards."""
    opened: list[Feed] = []

    def open_feed(key: str | None = None, **options: Any) -> Feed:
        feed = Feed(live_server.address, key or object_key, **options)
        opened.append(feed)
        return feed

    yield open_feed
    for feed in opened:
        feed.close()


def sentinel(session: Any, feed: Feed, name: str = "sentinel") -> ChangeEvent:
    """Appends a marker and returns the feed's next event, which must be the marker's append."""
    session.append_message(text_message(name, name))
    event = feed.next()
    assert (event.type, event.message and event.message.get("id")) == ("append", name), event
    return event


def summary(event: ChangeEvent) -> tuple[Any, ...]:
    ident = event.message.get("id") if event.message else None
    return (event.type, event.session_id, ident)


def image_message(message_id: str, payload: bytes) -> dict[str, Any]:
    import base64

    return {
        "id": message_id,
        "role": "user",
        "parts": [
            {"type": "text", "text": "look"},
            {
                "type": "file",
                "mediaType": "image/png",
                "url": "data:image/png;base64," + base64.b64encode(payload).decode(),
            },
        ],
    }


# ── subscription start ───────────────────────────────────────────────────────


def test_a_live_subscription_starts_with_progress_at_the_current_revision(
    feeds: Callable[..., Feed], session: Any
) -> None:
    first = feeds()
    session.append_message(text_message("m1"))
    event = first.next()
    assert event.type == "append" and event.revision > first.start_revision

    second = feeds()
    assert second.start_revision == event.revision
    session.append_message(text_message("m2"))
    assert first.next().revision == second.next().revision > event.revision


# ── payloads (upstream's listener events) ────────────────────────────────────


def test_append_events_carry_the_stored_message_inserted_and_the_parent_as_passed(
    feeds: Callable[..., Feed], session: Any
) -> None:
    feed = feeds()
    session.append_message(text_message("a", "first", metadata={"k": 1}))
    session.append_message(text_message("root2", "new root"), parent_id=None)
    session.append_message(text_message("child", "under a"), parent_id="a")
    unknown = session.append_message(text_message("orphan", "unknown parent"), parent_id="ghost")
    assert unknown.parent_id is None  # resolved to a root, as upstream

    events = feed.take(4)

    assert [e.type for e in events] == ["append"] * 4
    assert all(e.inserted for e in events)
    assert all(e.session_id == "" for e in events)
    assert [e.parent_id for e in events] == [AUTO, None, "a", "ghost"]
    for event in events:
        assert event.message is not None
        assert event.message == session.get_message(event.message["id"])
    assert events[0].message == text_message("a", "first", metadata={"k": 1})


def test_duplicate_append_emits_append_with_inserted_false_and_the_stored_message(
    feeds: Callable[..., Feed], session: Any
) -> None:
    session.append_message(text_message("a", "original"))
    feed = feeds()

    result = session.append_message(text_message("a", "replacement"))

    assert not result.inserted
    event = feed.next()
    assert (event.type, event.inserted, event.parent_id) == ("append", False, AUTO)
    assert event.message == text_message("a", "original")


def test_update_emits_only_when_the_row_changed(feeds: Callable[..., Feed], session: Any) -> None:
    session.append_message(text_message("a", "one"))
    feed = feeds()

    session.update_message(text_message("a", "two"))
    event = feed.next()
    assert (event.type, event.message) == ("update", text_message("a", "two"))

    session.update_message(text_message("a", "two"))  # identical: no event
    assert session.update_message(text_message("absent", "x")) is None  # missing: no event
    sentinel(session, feed)


def test_upsert_emits_append_for_a_new_id_and_update_for_a_changed_one(
    feeds: Callable[..., Feed], session: Any
) -> None:
    session.append_message(text_message("a"))
    feed = feeds()

    session.upsert_message(text_message("b", "new"), parent_id="a")
    session.upsert_message(text_message("b", "changed"))
    session.upsert_message(text_message("b", "changed"))  # identical: nothing

    appended, updated = feed.take(2)
    assert (appended.type, appended.inserted, appended.parent_id) == ("append", True, "a")
    assert appended.message == text_message("b", "new")
    assert (updated.type, updated.message) == ("update", text_message("b", "changed"))
    sentinel(session, feed)


def test_a_delete_whose_ids_would_not_fit_its_event_is_refused_unwritten(
    feeds: Callable[..., Feed], session: Any, data_dir: Path, object_key: str
) -> None:
    """The event carries the ids as passed, in one response: 100,000 ids of 40 characters made
    a 4.4 MB event, which no subscriber could receive (a resumed one met it again and again)."""
    session.append_messages([text_message("a"), text_message("b")])
    feed = feeds()
    too_many = ["a", *(f"{i:040d}" for i in range(100_000))]

    with pytest.raises(SessionsError) as caught:
        session.delete_messages(too_many)

    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.metadata["limit"] == "max_delete_ids_bytes"
    assert "nothing was deleted" in caught.value.message
    assert [r["id"] for r in message_rows(data_dir, object_key)] == ["a", "b"]
    sentinel(session, feed, "after-refused")  # no delete event came before it

    many = too_many[:60_000]  # about 2.5 MB: within the event's room
    assert session.delete_messages(many) == 1
    event = feed.next()
    assert (event.type, len(event.message_ids), event.message_ids[0]) == ("delete", 60_000, "a")
    sentinel(session, feed, "after-delete")


@pytest.mark.parametrize("size", [16 * 1024 + 1, 5 * 1024 * 1024])
def test_a_named_parent_past_the_id_limit_is_refused_before_its_event(
    feeds: Callable[..., Feed], session: Any, data_dir: Path, object_key: str, size: int
) -> None:
    """An append's event carries the parent id as passed (it need not exist): a 5 MB one made an
    event that no subscriber could receive."""
    session.append_message(text_message("a"))
    feed = feeds()
    long_parent = "p" * size
    attempts = [
        lambda: session.append_message(text_message("b"), parent_id=long_parent),
        lambda: session.append_messages([text_message("c")], parent_id=long_parent),
        lambda: session.upsert_message(text_message("d"), parent_id=long_parent),
    ]
    for attempt in attempts:
        with pytest.raises(SessionsError) as caught:
            attempt()
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.metadata["limit"] == "max_message_id_bytes"

    assert [r["id"] for r in message_rows(data_dir, object_key)] == ["a"]
    sentinel(session, feed)  # the feed is alive and saw nothing before it


def test_delete_carries_the_callers_ids_even_an_empty_list(feeds: Callable[..., Feed], session: Any) -> None:
    session.append_messages([text_message("a"), text_message("b")])
    feed = feeds()

    session.delete_messages(["b", "missing", "b"])
    session.delete_messages([])
    session.delete_messages(["nothing-here"])

    events = feed.take(3)
    assert [(e.type, e.message_ids) for e in events] == [
        ("delete", ("b", "missing", "b")),
        ("delete", ()),
        ("delete", ("nothing-here",)),
    ]
    assert [e.message for e in events] == [None, None, None]


def test_clear_always_emits(feeds: Callable[..., Feed], obj: Any) -> None:
    feed = feeds()
    obj.session("full").append_message(text_message("a"))
    obj.session("full").clear_messages()
    obj.session("empty").clear_messages()
    events = feed.take(3)
    assert [(e.type, e.session_id) for e in events] == [("append", "full"), ("clear", "full"), ("clear", "empty")]


def test_clear_and_delete_emit_on_an_object_never_written(
    feeds: Callable[..., Feed], obj: Any, data_dir: Path, object_key: str
) -> None:
    """As upstream, a clear is an event even for an empty session, and a delete one with the
    caller's ids even when none is stored; an object never written is empty, and its
    subscribers heard neither. Still no file is made for it."""
    feed = feeds()
    obj.session("s").clear_messages()
    obj.session("s").delete_messages(["m1", "m1"])
    obj.session("s").delete_messages([])
    assert not object_file(data_dir, object_key).exists()
    events = feed.take(3)
    assert [(e.type, e.session_id, tuple(e.message_ids)) for e in events] == [
        ("clear", "s", ()),
        ("delete", "s", ("m1", "m1")),
        ("delete", "s", ()),
    ]
    sentinel(obj.session("s"), feed)


def test_import_emits_the_input_message_and_duplicates_emit_nothing(feeds: Callable[..., Feed], session: Any) -> None:
    feed = feeds()
    first = {"id": "i1", "role": "user", "parts": [{"type": "text", "text": "verbatim"}], "extra": {"z": 1, "a": 2}}
    second = text_message("i2", "child")
    result = session.import_messages([ImportItem(first, None), ImportItem(second, "i1")])
    assert result.imported == 2

    events = feed.take(2)
    assert [(e.type, e.parent_id) for e in events] == [("import", None), ("import", "i1")]
    assert [e.message for e in events] == [first, second]

    assert not session.import_message(text_message("i1", "again"), parent_id=None)
    sentinel(session, feed)


def test_a_slow_import_stream_is_written_message_by_message(feeds: Callable[..., Feed], session: Any) -> None:
    """An import writes in chunks, but holds no message back while none of its writes is under
    way: a client that sends each message only after the previous one's event sees them all.
    Held back until a chunk fills or the stream ends, the first would never come (the guard)."""
    feed = feeds()
    seen: list[str] = []

    def items() -> Iterator[ImportItem]:
        for index in range(5):
            yield ImportItem(text_message(f"s{index}"), f"s{index - 1}" if index else None, 10 + index)
            event = feed.next()
            seen.append(f"{event.type}:{event.message['id'] if event.message else None}")

    result = session.import_messages(items())

    assert result.imported == 5
    assert seen == [f"import:s{index}" for index in range(5)]


def test_add_compaction_emits_compaction_with_the_record(feeds: Callable[..., Feed], session: Any) -> None:
    session.append_messages([text_message(f"m{i}") for i in range(4)])
    feed = feeds()

    record = session.add_compaction("a summary", "m0", "m2")

    event = feed.next()
    assert (event.type, event.session_id, event.message) == ("compaction", "", None)
    assert event.compaction == record
    assert (record.summary, record.from_message_id, record.to_message_id) == ("a summary", "m0", "m2")


def test_writes_of_compaction_ids_emit_nothing(feeds: Callable[..., Feed], session: Any) -> None:
    session.append_messages([text_message("m0"), text_message("m1")])
    feed = feeds()

    assert not session.append_message(text_message("compaction_x", "echo")).inserted
    assert session.update_message(text_message("compaction_x", "echo")) is None
    assert not session.upsert_message(text_message("compaction_y", "echo")).inserted
    results = session.append_messages([text_message("compaction_z"), text_message("real")])
    assert [r.inserted for r in results] == [False, True]

    event = feed.next()
    assert summary(event) == ("append", "", "real")
    assert event.parent_id is AUTO
    sentinel(session, feed)


def test_upstream_event_order(feeds: Callable[..., Feed], session: Any) -> None:
    """Upstream's change-feed test: append, append(dup), update, delete, clear."""
    feed = feeds()
    session.append_message(text_message("a", "x"))
    session.append_message(text_message("a", "y"))
    session.update_message(text_message("a", "z"))
    session.delete_messages(["a"])
    session.clear_messages()
    events = feed.take(5)
    assert [(e.type, e.inserted) for e in events] == [
        ("append", True),
        ("append", False),
        ("update", False),
        ("delete", False),
        ("clear", False),
    ]
    revisions = [e.revision for e in events]
    assert revisions == sorted(set(revisions))


# ── session filter ───────────────────────────────────────────────────────────


def test_session_filter(feeds: Callable[..., Feed], obj: Any) -> None:
    only_a = feeds(session_id="a")
    only_default = feeds(session_id="")
    everything = feeds()
    a, b, default = obj.session("a"), obj.session("b"), obj.session("")

    a.append_message(text_message("a1"))
    b.append_message(text_message("b1"))
    default.append_message(text_message("d1"))
    b.clear_messages()
    a.delete_messages(["a1"])
    default.append_message(text_message("d2"))

    assert [summary(e) for e in only_a.take(2)] == [("append", "a", "a1"), ("delete", "a", None)]
    assert [summary(e) for e in only_default.take(2)] == [("append", "", "d1"), ("append", "", "d2")]
    all_events = everything.take(6)
    assert [summary(e) for e in all_events] == [
        ("append", "a", "a1"),
        ("append", "b", "b1"),
        ("append", "", "d1"),
        ("clear", "b", None),
        ("delete", "a", None),
        ("append", "", "d2"),
    ]
    revisions = [e.revision for e in all_events]
    assert revisions == sorted(set(revisions))


def test_other_objects_are_not_seen(feeds: Callable[..., Feed], session: Any, client: Any) -> None:
    feed = feeds()
    client.object(session.object.key + "-other").session().append_message(text_message("elsewhere"))
    sentinel(session, feed)


# ── ordered, unique, atomic ──────────────────────────────────────────────────


def test_concurrent_writers_each_acknowledged_append_arrives_once_in_commit_order(
    feeds: Callable[..., Feed], session: Any, data_dir: Path, object_key: str
) -> None:
    writers, per_writer = 4, 50
    readable: list[bool] = []

    def check_readable(event: ChangeEvent) -> None:
        # Published only after commit: the message is readable the moment its event arrives.
        if event.type == "append" and event.message is not None:
            readable.append(session.get_message(event.message["id"]) is not None)

    feed = feeds(on_event=check_readable)
    acknowledged: dict[int, list[str]] = {w: [] for w in range(writers)}
    failures: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(writer: int) -> None:
        try:
            start.wait(timeout=GUARD_SECONDS)
            for i in range(per_writer):
                ident = f"w{writer}-{i:03d}"
                assert session.append_message(text_message(ident, ident)).inserted
                acknowledged[writer].append(ident)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=GUARD_SECONDS * 2)
    assert not failures, failures

    events = feed.take(writers * per_writer)
    sentinel(session, feed)  # and nothing more before it

    assert all(e.type == "append" and e.inserted for e in events)
    seen = [e.message["id"] for e in events if e.message is not None]
    assert Counter(seen) == Counter(i for ids in acknowledged.values() for i in ids)
    assert max(Counter(seen).values()) == 1
    revisions = [e.revision for e in events]
    assert all(later > earlier for earlier, later in itertools.pairwise(revisions))
    for writer, ids in acknowledged.items():
        assert [i for i in seen if i.startswith(f"w{writer}-")] == ids
    # Commit order: the feed order is the order the rows were written (seq).
    by_seq = [row["id"] for row in message_rows(data_dir, object_key) if row["id"] != "sentinel"]
    assert seen == by_seq
    assert len(readable) == writers * per_writer + 1 and all(readable)


def test_a_batch_append_is_three_adjacent_events_even_with_a_concurrent_writer(
    feeds: Callable[..., Feed], obj: Any
) -> None:
    feed = feeds()
    batches, other_writes = 20, 60
    main, other = obj.session("main"), obj.session("other")
    done = threading.Event()
    failures: list[BaseException] = []

    def interleave() -> None:
        try:
            for i in range(other_writes):
                other.append_message(text_message(f"o{i}"))
        except BaseException as error:
            failures.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=interleave)
    thread.start()
    for b in range(batches):
        main.append_messages([text_message(f"b{b}-{k}") for k in range(3)])
    thread.join(timeout=GUARD_SECONDS * 2)
    assert done.is_set() and not failures, failures

    events = feed.take(batches * 3 + other_writes)
    ids = [e.message["id"] for e in events if e.message is not None]
    assert len(ids) == len(events)
    for b in range(batches):
        at = ids.index(f"b{b}-0")
        assert ids[at : at + 3] == [f"b{b}-0", f"b{b}-1", f"b{b}-2"], ids[at - 2 : at + 5]
        revs = [e.revision for e in events[at : at + 3]]
        assert revs == sorted(set(revs))
    assert [i for i in ids if i.startswith("o")] == [f"o{i}" for i in range(other_writes)]


def test_a_rejected_batch_emits_nothing(feeds: Callable[..., Feed], session: Any) -> None:
    feed = feeds()
    with pytest.raises(SessionsError) as caught:
        session.append_messages([text_message("ok1"), {"id": "bad", "role": "user"}, text_message("ok2")])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    sentinel(session, feed)
    assert session.get_message("ok1") is None


# ── framing and attachments ──────────────────────────────────────────────────


def test_a_large_message_arrives_whole(feeds: Callable[..., Feed], session: Any) -> None:
    """5 MB is beyond one 4 MiB frame: the event's message comes in pieces that the client joins
    (the feed's client uses gRPC's default 4 MiB receive limit)."""
    feed = feeds()
    large = text_message("large", "é" + "x" * (5 * 1000 * 1000) + "🙂")

    session.append_message(large)
    session.update_message(text_message("large", "y" * (6 * 1000 * 1000)))

    appended, updated = feed.take(2)
    assert appended.type == "append" and appended.message is not None
    assert appended.message["parts"][0]["text"] == large["parts"][0]["text"]
    assert appended.message == large
    assert updated.type == "update" and updated.message is not None
    assert len(updated.message["parts"][0]["text"]) == 6 * 1000 * 1000
    sentinel(session, feed)


def test_attachments_are_inline_or_pointers_as_the_subscriber_asks(
    feeds: Callable[..., Feed], session: Any, obj: Any
) -> None:
    inline = feeds()
    pointers = feeds(pointers=True)
    payload = bytes(range(256)) * 64
    message = image_message("img", payload)

    session.append_message(message)

    inline_event, pointer_event = inline.next(), pointers.next()
    assert inline_event.message == session.get_message("img")
    assert inline_event.message == message
    assert pointer_event.message == session.get_message("img", pointers=True)
    url = pointer_event.message["parts"][1]["url"]
    assert url.startswith("attachment:sha256:")
    attachment = obj.read_attachment(url.removeprefix("attachment:sha256:"))
    assert (attachment.media_type, attachment.data) == ("image/png", payload)
    assert inline_event.revision == pointer_event.revision


# ── resume ───────────────────────────────────────────────────────────────────


def test_resume_delivers_exactly_the_events_after_the_revision(feeds: Callable[..., Feed], session: Any) -> None:
    first = feeds()
    session.append_messages([text_message("a"), text_message("b")])
    seen = first.take(2)
    resume_at = seen[-1].revision
    first.close()

    session.append_message(text_message("c"))
    session.update_message(text_message("a", "changed"))
    session.delete_messages(["b"])

    resumed = feeds(resume_from=resume_at)
    missed = resumed.take(3)
    assert [summary(e) for e in missed] == [("append", "", "c"), ("update", "", "a"), ("delete", "", None)]
    assert missed[0].revision > resume_at
    assert all(e.type != "reset" for e in missed)
    # …then it continues live.
    live = sentinel(session, resumed)
    assert live.revision > missed[-1].revision


def test_resume_from_an_earlier_point_replays_everything_after_it(feeds: Callable[..., Feed], session: Any) -> None:
    feed = feeds()
    session.append_messages([text_message(i) for i in "abcde"])
    events = feed.take(5)
    for _ in range(2):  # repeatable: the same point gives the same events with the same revisions
        replay = feeds(resume_from=events[1].revision)
        replayed = replay.take(3)
        assert [(summary(e), e.revision) for e in replayed] == [(summary(e), e.revision) for e in events[2:]]


def test_resume_from_the_newest_revision_misses_nothing_and_stays_live(
    feeds: Callable[..., Feed], session: Any
) -> None:
    feed = feeds()
    session.append_message(text_message("a"))
    newest = feed.next().revision

    resumed = feeds(resume_from=newest)
    session.append_message(text_message("b"))
    event = resumed.next()
    assert summary(event) == ("append", "", "b")
    assert event.revision > newest


def test_resume_with_a_session_filter_replays_only_that_session(feeds: Callable[..., Feed], obj: Any) -> None:
    feed = feeds()
    obj.session("x").append_message(text_message("x0"))
    start = feed.next().revision
    obj.session("x").append_message(text_message("x1"))
    obj.session("y").append_message(text_message("y1"))
    obj.session("x").append_message(text_message("x2"))
    feed.take(3)

    resumed = feeds(resume_from=start, session_id="x")
    assert [summary(e) for e in resumed.take(2)] == [("append", "x", "x1"), ("append", "x", "x2")]
    sentinel(obj.session("x"), resumed)


def test_a_resume_on_an_object_still_never_written_is_not_reset(
    feeds: Callable[..., Feed], client: Any, object_key: str
) -> None:
    """A subscriber to an object not yet written reconnected to a reset every time: the feed's
    clock went with its last subscriber. Nothing can have happened since, so it is placed live,
    and told where it starts as a live subscriber is; once the object was written meanwhile by
    a feed that still retains the event, the resume gets that event."""
    first = feeds()
    start = first.start_revision
    first.close()  # the object's only subscriber: its feed goes

    resumed = feeds(resume_from=start)
    # Placed (an append before it would make the resume a reset, as below), at the new clock.
    assert resumed.next(progress=True).type == "progress"
    session = client.object(object_key).session()
    event = sentinel(session, resumed)
    assert event.revision > start
    resumed.close()

    written = feeds(resume_from=start)
    replayed = written.next()
    assert (replayed.type, replayed.revision) == ("append", event.revision)


@pytest.mark.parametrize("where", ["ancient", "future"])
def test_resume_from_an_unknown_revision_starts_with_reset(
    feeds: Callable[..., Feed], session: Any, where: str
) -> None:
    feed = feeds()
    session.append_message(text_message("a"))
    current = feed.next().revision
    resume_from = 1 if where == "ancient" else current + (1 << 40)

    resumed = feeds(resume_from=resume_from)

    reset = resumed.next()
    assert reset.type == "reset"
    assert reset.error  # says why
    live = sentinel(session, resumed)
    assert live.revision > current


def test_resume_beyond_retention_starts_with_reset_then_continues_live(
    feeds: Callable[..., Feed], session: Any
) -> None:
    """The server keeps the newest 10,000 events (DEFAULT_RETAIN_EVENTS): a resume point more
    than that far behind is gone, and the stream says so instead of leaving a silent gap."""
    feed = feeds()
    session.append_message(text_message("start"))
    resume_at = feed.next().revision
    feed.close()
    total = 10_050
    for begin in range(0, total, 1000):
        session.append_messages([text_message(f"m{i}") for i in range(begin, min(total, begin + 1000))])

    resumed = feeds(resume_from=resume_at)

    first = resumed.next()
    assert first.type == "reset", summary(first)
    assert "retain" in first.error
    live = sentinel(session, resumed)
    assert live.revision > resume_at


def test_a_subscriber_within_retention_gets_every_event_of_a_large_burst(
    feeds: Callable[..., Feed], session: Any
) -> None:
    """Retention is 10,000 events; a resume 5,000 events behind is within it, so it must replay
    them all (a reset is only for what the server no longer has)."""
    feed = feeds()
    session.append_message(text_message("start"))
    resume_at = feed.next().revision
    feed.close()
    total = 5_000
    for begin in range(0, total, 1000):
        session.append_messages([text_message(f"m{i}") for i in range(begin, begin + 1000)])

    resumed = feeds(resume_from=resume_at)
    first = resumed.next()
    assert first.type != "reset", f"reset although every missed event is retained: {first.error!r}"
    session.append_message(text_message("sentinel"))
    events = [first, *resumed.until(lambda e: e.message is not None and e.message["id"] == "sentinel")]

    assert [e.type for e in events if e.type != "append"] == []
    assert [e.message["id"] for e in events if e.message] == [*(f"m{i}" for i in range(total)), "sentinel"]


# ── slow subscribers ─────────────────────────────────────────────────────────


def test_writes_to_other_objects_push_the_oldest_events_out_of_the_process_bound(tmp_path: Path) -> None:
    """All open objects keep their events within one bound (`--feed-retain-total-bytes`): a
    resume point whose events went to make room for another object's gets a reset, not a gap."""
    from tests.conftest import start_server

    server = start_server(tmp_path / "data", feed=FeedSettings(retain_total_bytes=64 * 1024))
    try:
        with SessionsClient(server.address) as client:
            quiet, busy = client.object("quiet").session(), client.object("busy").session()
            feed = Feed(server.address, "quiet")
            quiet.append_message(text_message("kept for a while"))
            resume_at = feed.next().revision - 1
            feed.close()
            within = Feed(server.address, "quiet", resume_from=resume_at)
            assert within.next().message["id"] == "kept for a while"  # retained so far
            within.close()

            watcher = Feed(server.address, "busy")  # watched: its events are kept too (not nobody's)
            busy.append_messages([text_message(f"b{i}", "x" * 1000) for i in range(100)])  # ≈125 KB of events
            watcher.close()

            resumed = Feed(server.address, "quiet", resume_from=resume_at)
            first = resumed.next()
            assert first.type == "reset" and "retain" in first.error, summary(first)
            resumed.close()
    finally:
        server.stop()


def test_a_resume_to_one_session_is_not_reset_for_other_sessions_traffic(tmp_path: Path) -> None:
    """A mirror of one session in a busy object reconnects after the object's retention turned
    over with other sessions' events: it missed nothing of its own, so it resumes without a
    reset (and without re-reading its session); a resume that did miss dropped events is reset."""
    from tests.conftest import start_server

    server = start_server(tmp_path / "data", feed=FeedSettings(retain_events=10))
    try:
        with SessionsClient(server.address) as client:
            obj = client.object("busy")
            feed = Feed(server.address, "busy", session_id="mine")
            obj.session("mine").append_message(text_message("before"))
            resume_at = feed.next().revision
            feed.close()
            obj.session("other").append_messages([text_message(f"o{i}") for i in range(30)])

            mine = Feed(server.address, "busy", resume_from=resume_at, session_id="mine")
            obj.session("mine").append_message(text_message("after"))
            assert summary(mine.next()) == ("append", "mine", "after")  # not a reset first
            mine.close()

            for session_id in (None, "other"):
                options = {} if session_id is None else {"session_id": session_id}
                resumed = Feed(server.address, "busy", resume_from=resume_at, **options)
                first = resumed.next()
                assert first.type == "reset" and "retain" in first.error, summary(first)
                resumed.close()
    finally:
        server.stop()


def test_a_stalled_subscriber_does_not_block_writers_and_later_sees_a_reset(tmp_path: Path) -> None:
    """A subscriber that stops reading holds no events: the object keeps its 500 newest (its
    own server's retention), writers go on, and when the subscriber reads again it gets what the
    transport had buffered, then a reset for what retention dropped, then the live feed."""
    from tests.conftest import start_server

    key = "stalled"
    server = start_server(tmp_path / "data", feed=FeedSettings(retain_events=500))
    healthy: Feed | None = None
    # Its own connection: gRPC shares a connection between channels to one address, and a stream
    # that is never read eventually holds that connection's flow-control window for everyone.
    channel = grpc.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)])
    client = SessionsClient(server.address)
    try:
        session = client.object(key).session()
        healthy = Feed(server.address, key)
        stub = sessions_pb2_grpc.SessionServiceStub(channel)
        call = stub.Subscribe(pb.SubscribeRequest(object_key=key), metadata=routing_metadata(key), timeout=120)
        first = next(call)
        assert first.type == pb.CHANGE_TYPE_PROGRESS  # registered; from now on it never reads

        # 4,000 events of ~4 KB: more than the transport's buffers hold, and 8 times what the
        # object retains. Every write is acknowledged although the stalled stream is not read.
        # The healthy subscriber gets each batch before the next is written: it shares this
        # process (and its interpreter lock) with the server; this test is about the stalled one.
        written: list[str] = []
        received: list[ChangeEvent] = []
        for batch in range(40):
            items = [text_message(f"m{batch:02d}-{k:02d}", "z" * 4000) for k in range(100)]
            session.append_messages(items)
            written += [m["id"] for m in items]
            received += healthy.take(len(items))

        # The healthy subscriber got everything, in order, without a reset.
        assert [e.message["id"] for e in received if e.message] == written

        session.append_message(text_message("after-stall"))
        final = healthy.next()
        assert final.message is not None and final.message["id"] == "after-stall"

        # Now the stalled subscriber reads, up to the final write's revision (a reset carries the
        # revision it brings the subscriber up to: here the final write's).
        assembler = EventAssembler()

        def stalled_events() -> Iterator[ChangeEvent]:
            for response in call:
                event = assembler.feed(response)
                if event is not None and event.type != "progress":
                    yield event

        reading = stalled_events()
        stalled: list[ChangeEvent] = []
        for event in reading:
            stalled.append(event)
            if event.revision >= final.revision:
                break

        # After the reset the feed is live again: the next write is the next event.
        session.append_message(text_message("after-reset"))
        live = next(reading)
        call.cancel()
    finally:
        channel.close()
        if healthy is not None:
            healthy.close()
        client.close()
        server.stop()

    types = [e.type for e in stalled]
    all_ids = [*written, "after-stall"]
    assert "reset" in types, f"no reset although retention dropped unread events: {len(stalled)} events"
    first_reset, last_reset = types.index("reset"), len(types) - 1 - types[::-1].index("reset")
    before = [e.message["id"] for e in stalled[:first_reset] if e.message]
    after = [e.message["id"] for e in stalled[last_reset + 1 :] if e.message]
    # What it got before the reset is a prefix of the writes, what follows it a suffix; the
    # reset stands for a real gap between them, and says why.
    assert before == all_ids[: len(before)]
    assert after == all_ids[len(all_ids) - len(after) :]
    assert len(before) + len(after) < len(all_ids), (len(before), len(after))
    assert stalled[first_reset].error
    # Revisions increase through the reset: it carries the revision it caught up to.
    revisions = [e.revision for e in stalled]
    assert revisions == sorted(revisions)
    assert stalled[-1].revision == final.revision
    assert (live.type, live.message and live.message["id"]) == ("append", "after-reset"), summary(live)
    assert live.revision > final.revision


def test_many_subscribers_all_receive_everything(feeds: Callable[..., Feed], session: Any) -> None:
    subscribers = [feeds() for _ in range(10)]
    session.append_messages([text_message(f"m{i}") for i in range(100)])
    expected = [f"m{i}" for i in range(100)]
    for feed in subscribers:
        assert [e.message["id"] for e in feed.take(100) if e.message] == expected


# ── progress, shutdown ───────────────────────────────────────────────────────


def test_idle_streams_get_progress_at_the_configured_interval(tmp_path: Path) -> None:
    from tests.conftest import start_server

    server = start_server(tmp_path / "data", progress_seconds=0.2)
    feed: Feed | None = None
    try:
        with SessionsClient(server.address) as client:
            session = client.object("idle").session()
            session.append_message(text_message("before"))
            feed = Feed(server.address, "idle")
            started = time.monotonic()
            idle = [feed.next(progress=True) for _ in range(3)]
            elapsed = time.monotonic() - started
            assert [e.type for e in idle] == ["progress"] * 3
            assert [e.revision for e in idle] == [feed.start_revision] * 3
            assert elapsed >= 3 * 0.2 * 0.9, elapsed  # not faster than the interval
            assert elapsed < 10, elapsed

            session.append_message(text_message("after"))
            event = feed.next(progress=True)
            assert (event.type, event.revision > feed.start_revision) == ("append", True)
            later = feed.next(progress=True)
            assert (later.type, later.revision) == ("progress", event.revision)
    finally:
        if feed is not None:
            feed.close()
        server.stop()


def test_a_clients_call_timeout_does_not_end_its_subscriptions(tmp_path: Path) -> None:
    from sessions_client import aio
    from tests.conftest import start_server

    server = start_server(tmp_path / "data", progress_seconds=0.1)
    try:
        with SessionsClient(server.address, timeout=0.3) as client:
            feed = client.object("patient").subscribe(include_progress=True, reconnect_attempts=0)
            started = time.monotonic()
            assert [next(feed).type for _ in range(8)] == ["progress"] * 8  # ≈0.8 s: past the timeout
            assert time.monotonic() - started > 0.3
            feed.close()

        async def asynchronously() -> list[str]:
            async with aio.SessionsClient(server.address, timeout=0.3) as client:
                feed = client.object("patient").subscribe(include_progress=True, reconnect_attempts=0)
                seen = [(await anext(feed)).type for _ in range(8)]
                await feed.aclose()
                return seen

        assert asyncio.run(asynchronously()) == ["progress"] * 8
    finally:
        server.stop()


def test_graceful_shutdown_ends_subscriptions_with_unavailable(tmp_path: Path) -> None:
    from tests.conftest import start_server

    server = start_server(tmp_path / "data")
    feed = Feed(server.address, "shutdown", reconnect_attempts=0)
    raw_channel = grpc.insecure_channel(server.address)
    try:
        raw = sessions_pb2_grpc.SessionServiceStub(raw_channel).Subscribe(
            pb.SubscribeRequest(object_key="shutdown"), metadata=routing_metadata("shutdown"), timeout=60
        )
        assert next(raw).type == pb.CHANGE_TYPE_PROGRESS

        server.stop()

        error = feed.get()
        assert isinstance(error, SessionsError), error
        assert error.code == grpc.StatusCode.UNAVAILABLE
        assert feed.get() is _END
        with pytest.raises(grpc.RpcError) as caught:
            list(raw)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        raw_channel.close()
        feed.close()


# ── mirror ───────────────────────────────────────────────────────────────────


def test_mirror_follows_the_session(feeds: Callable[..., Feed], obj: Any) -> None:
    session = obj.session("mirrored")
    session.append_messages([text_message("pre1", "before subscribing"), text_message("pre2")])
    feed = feeds()
    mirror = session.mirror()
    assert mirror.messages == session.get_history()

    def step(write: Callable[[], Any], events: int = 1) -> None:
        write()
        for event in feed.take(events):
            mirror.apply(event)
        assert mirror.messages == session.get_history()

    step(lambda: session.append_message(text_message("a", "one")))
    step(lambda: session.append_messages([text_message("b"), text_message("c")]), events=2)
    step(lambda: session.append_message(text_message("a", "duplicate")))
    step(lambda: session.update_message(text_message("b", "edited")))
    step(lambda: session.delete_messages(["pre2", "b"]))
    step(lambda: obj.session("elsewhere").append_message(text_message("x")))
    step(lambda: obj.session("elsewhere").clear_messages())
    step(lambda: session.clear_messages())
    assert mirror.messages == []
    step(lambda: session.append_message(text_message("fresh")))
    assert [m["id"] for m in mirror.messages] == ["fresh"]


def test_a_mirror_resumes_from_its_revision_and_misses_nothing_written_after_its_read(
    feeds: Callable[..., Feed], obj: Any
) -> None:
    session = obj.session("late-subscriber")
    session.append_message(text_message("before"))
    mirror = session.mirror()
    assert [m["id"] for m in mirror.messages] == ["before"]
    session.append_message(text_message("between", "written before anyone subscribed"))
    feed = feeds(session_id=session.id, resume_from=mirror.revision)
    event = feed.next()
    mirror.apply(event)
    assert (event.type, event.message and event.message["id"]) == ("append", "between")
    assert mirror.messages == session.get_history()
    assert mirror.revision == event.revision


def test_mirror_rereads_on_reset(feeds: Callable[..., Feed], session: Any) -> None:
    session.append_messages([text_message("a"), text_message("b")])
    mirror = session.mirror()
    mirror.messages = []  # out of date
    resumed = feeds(resume_from=1)
    reset = resumed.next()
    assert reset.type == "reset"
    mirror.apply(reset)
    assert mirror.messages == session.get_history()
    # A resume point ahead of the feed (another server's) is reset to the feed's revision: the
    # mirror takes that one, not the higher point, whose every resume would reset again.
    mirror.revision = reset.revision + (1 << 40)
    ahead = feeds(resume_from=mirror.revision).next()
    assert ahead.type == "reset" and ahead.revision < mirror.revision
    mirror.apply(ahead)
    assert mirror.revision == ahead.revision
    session.append_message(text_message("c"))
    event = feeds(resume_from=mirror.revision).next()  # resumed: no reset this time
    assert (event.type, event.message and event.message["id"]) == ("append", "c")
