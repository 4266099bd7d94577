"""The change feed (reference notes §9): upstream's `subscribe()` events (buffered in the oracle's
object) against our `Subscribe` stream, event by event: type, session, payload."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sessions_client import AUTO, SessionsClient
from tests.conformance.harness.canon import canon
from tests.conformance.harness.messages import msg
from tests.conformance.harness.ours import OurServerProcess
from tests.conformance.harness.pair import Pair

GUARD_SECONDS = 30.0  # a failure guard on waits, never a synchronisation device
SENTINEL_SESSION = "feed-sentinel"


class Recorder:
    """Our object's events, collected by a background subscriber (progress events dropped).

    The subscription is live once its first event arrives: the server's progress event, sent
    only once the subscription is registered. What a step emitted is read up to a sentinel: a
    message appended (on both sides) in a session of its own after the step, whose event comes
    after every event of the commits before it, so nothing of the step can arrive later."""

    def __init__(self, pair: Pair, address: str) -> None:
        self._pair = pair
        self._events: list[Any] = []
        self._changed = threading.Condition()
        self._live = False
        self._ended: str | None = None
        self._sentinels = 0
        self._client = SessionsClient(address)  # its own channel: closing it ends the stream
        self._stream: Iterator[Any] = self._client.object(pair.key).subscribe(
            include_progress=True, reconnect_attempts=0
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._wait(lambda: self._live, "our Subscribe stream sent nothing")

    def _run(self) -> None:
        ended = "the subscription ended"
        try:
            for event in self._stream:
                with self._changed:
                    self._live = True
                    if event.type != "progress":
                        self._events.append(event)
                    self._changed.notify_all()
        except Exception as error:  # handed to the waiting test thread
            ended = f"the subscription failed: {error!r}"
        with self._changed:
            self._ended = ended
            self._changed.notify_all()

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float = GUARD_SECONDS) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: ready() or self._ended is not None, timeout):
                raise AssertionError(f"{what} within {timeout} s")
            if not ready():
                raise AssertionError(f"{what}: {self._ended}")

    def wait_for(self, predicate: Callable[[list[Any]], bool], what: str) -> list[Any]:
        """Waits until `predicate` holds of the events received (and not yet taken); returns them."""
        self._wait(lambda: predicate(self._events), what)
        with self._changed:
            return list(self._events)

    def sentinel(self) -> str:
        """Appends the next sentinel message on both sides; returns its id."""
        self._sentinels += 1
        message_id = f"sentinel-{self._sentinels}"
        self._pair.append(msg(message_id), session=SENTINEL_SESSION, check=False)
        return message_id

    def take_through(self, sentinel: str) -> list[Any]:
        """Our events up to and including the sentinel's append (taken: later calls see only
        what came after it)."""

        def position() -> int | None:
            for index, event in enumerate(self._events):
                if event.type == "append" and event.session_id == SENTINEL_SESSION and event.message["id"] == sentinel:
                    return index
            return None

        self._wait(lambda: position() is not None, f"no event for the sentinel {sentinel!r}")
        with self._changed:
            end = position()
            assert end is not None
            out, self._events = self._events[: end + 1], self._events[end + 1 :]
        return out

    def close(self) -> None:
        self._client.close()
        self._thread.join(timeout=GUARD_SECONDS)


def _up_event(e: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": e["type"], "session": e["sessionId"]}
    if e["type"] == "append":
        out |= {
            "message": canon(e["message"]),
            "inserted": e["inserted"],
            "parent": e.get("parentId") if e["parentIdPresent"] else "AUTO",
        }
    elif e["type"] == "update":
        out["message"] = canon(e["message"])
    elif e["type"] == "delete":
        out["ids"] = list(e["messageIds"])
    elif e["type"] == "import":
        out |= {"message": canon(e["message"]), "parent": e.get("parentId")}
    elif e["type"] == "compaction":
        c = e["compaction"]
        out["compaction"] = {"summary": c["summary"], "from": c["fromMessageId"], "to": c["toMessageId"]}
    return out


def _our_event(e: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": e.type, "session": e.session_id}
    if e.type == "append":
        out |= {
            "message": canon(e.message),
            "inserted": e.inserted,
            "parent": "AUTO" if e.parent_id is AUTO else e.parent_id,
        }
    elif e.type == "update":
        out["message"] = canon(e.message)
    elif e.type == "delete":
        out["ids"] = list(e.message_ids)
    elif e.type == "import":
        out |= {"message": canon(e.message), "parent": e.parent_id}
    elif e.type == "compaction":
        c = e.compaction
        out["compaction"] = {"summary": c.summary, "from": c.from_message_id, "to": c.to_message_id}
    return out


@pytest.fixture
def feed(pair: Pair, our_server: OurServerProcess) -> Iterator[Recorder]:
    pair.oracle.call(pair.key, "", "events", {})  # start the object; drop anything buffered
    recorder = Recorder(pair, our_server.address)
    yield recorder
    recorder.close()


def _compare(pair: Pair, feed: Recorder, label: str) -> None:
    """The events of the steps since the last comparison, and the sentinel's after them."""
    sentinel = feed.sentinel()
    up = [_up_event(e) for e in pair.oracle.call(pair.key, "", "events", {})]
    ours = [_our_event(e) for e in feed.take_through(sentinel)]
    assert up == ours, f"events after {label}"


def test_write_events(pair: Pair, feed: Recorder) -> None:
    steps = [
        ("append", lambda: pair.append(msg("a"), check=False)),
        ("duplicate append", lambda: pair.append(msg("a", "dup"), parent=None, check=False)),
        ("append root", lambda: pair.append(msg("b"), parent=None, check=False)),
        ("append explicit", lambda: pair.append(msg("c"), parent="a", check=False)),
        ("append unknown parent", lambda: pair.append(msg("d"), parent="zz", check=False)),
        ("overlay id append", lambda: pair.append(msg("compaction_x"), check=False)),
        ("update changed", lambda: pair.update(msg("a", "changed"), check=False)),
        ("update unchanged", lambda: pair.update(msg("a", "changed"), check=False)),
        ("update absent", lambda: pair.update(msg("nope"), check=False)),
        ("upsert new", lambda: pair.upsert(msg("e"), parent="b", check=False)),
        ("upsert existing", lambda: pair.upsert(msg("e", "e2"), check=False)),
        ("client strip", lambda: pair.append(msg("f", metadata={"channel": 1, "k": 2}), source="client", check=False)),
        ("import", lambda: pair.import_(msg("g"), parent="missing", created_at=1_600_000_000_000, check=False)),
        ("import duplicate", lambda: pair.import_(msg("g"), parent=None, created_at=1, check=False)),
        ("delete empty", lambda: pair.delete([], check=False)),
        ("delete with duplicates", lambda: pair.delete(["c", "c", "unknown"], check=False)),
        ("other session", lambda: pair.append(msg("a"), session="s1", check=False)),
        ("clear", lambda: pair.clear(check=False)),
        ("clear empty", lambda: pair.clear(session="empty", check=False)),
    ]
    for label, step in steps:
        step()
        _compare(pair, feed, label)
    pair.check()


def test_compaction_events(pair: Pair, feed: Recorder) -> None:
    for i in range(12):
        pair.append(msg(f"m{i}"), check=False)
    _compare(pair, feed, "appends")
    pair.add_compaction("by hand", "m1", "m2", check=False)
    _compare(pair, feed, "addCompaction")


def test_compact_event(pair: Pair, feed: Recorder) -> None:
    """compact() stores its overlay with a payload-less `compact` event (not `compaction`)."""
    for i in range(12):
        pair.append(msg(f"m{i}"), check=False)
    _compare(pair, feed, "appends")
    pair.compact_reference(keep_recent_tokens=1, check=False)
    _compare(pair, feed, "compact")
