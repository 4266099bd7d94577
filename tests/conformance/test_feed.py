"""The change feed (reference notes §9): upstream's `subscribe()` events (buffered in the oracle's
object) against our `Subscribe` stream, event by event: type, session, payload."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sessions_client import AUTO, SessionsClient
from tests.conformance.harness.canon import canon
from tests.conformance.harness.messages import msg
from tests.conformance.harness.ours import OurServerProcess
from tests.conformance.harness.pair import Pair


class Recorder:
    """Our object's events, collected by a background subscriber (progress events dropped)."""

    def __init__(self, pair: Pair, address: str) -> None:
        self.events: list[Any] = []
        self.ready = threading.Event()
        self._client = SessionsClient(address)  # its own channel: closing it ends the stream
        self._stream: Iterator[Any] = self._client.object(pair.key).subscribe(
            include_progress=True, reconnect_attempts=0
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.ready.wait(10), "our Subscribe stream sent nothing within 10 s"

    def _run(self) -> None:
        try:
            for event in self._stream:
                self.ready.set()
                if event.type != "progress":
                    self.events.append(event)
        except Exception:
            self.ready.set()

    def take(self, count: int, timeout: float = 5.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while len(self.events) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # anything extra arrives too
        out, self.events = self.events, []
        return out

    def close(self) -> None:
        self._client.close()
        self._thread.join(timeout=10)


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
    up = [_up_event(e) for e in pair.oracle.call(pair.key, "", "events", {})]
    ours = [_our_event(e) for e in feed.take(len(up))]
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
