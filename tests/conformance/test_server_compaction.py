"""Server-side compaction (`Compact` RPC and automatic compaction by policy) against upstream's
compact() / compactAfter() with createCompactFunction. Both sides use the same fake model: it
answers `SUMMARY(<prompt length in UTF-16 units> chars)`; ours reaches it as an OpenAI-compatible
chat-completions endpoint on loopback, served here."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sessions_client import SessionsClient
from tests.conformance.harness.messages import msg
from tests.conformance.harness.oracle import Oracle
from tests.conformance.harness.ours import OurServerProcess
from tests.conformance.harness.pair import Pair
from tests.conformance.test_feed import Recorder, _our_event, _up_event


def fake_summary(prompt: str) -> str:
    return f"SUMMARY({len(prompt.encode('utf-16-le')) // 2} chars)"


class _FakeModel(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        prompt = body["messages"][-1]["content"]
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": fake_summary(prompt)}}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


class SummarizingServer(OurServerProcess):
    def __init__(self, data_dir: Path, log_path: Path, summarizer_url: str) -> None:
        super().__init__(data_dir, log_path)
        self.summarizer_url = summarizer_url

    def extra_args(self) -> list[str]:
        return ["--summarizer-url", self.summarizer_url]


@pytest.fixture(scope="module")
def fake_model() -> Iterator[str]:
    """The fake model's URL."""
    model = ThreadingHTTPServer(("127.0.0.1", 0), _FakeModel)
    thread = threading.Thread(target=model.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{model.server_address[1]}"
    finally:
        model.shutdown()
        thread.join(timeout=30)
        model.server_close()


@pytest.fixture(scope="module")
def summarizing(
    tmp_path_factory: pytest.TempPathFactory, fake_model: str
) -> Iterator[tuple[OurServerProcess, SessionsClient]]:
    base = tmp_path_factory.mktemp("summarizing")
    server = SummarizingServer(base / "data", base / "server.log", fake_model)
    server.start()
    client = SessionsClient(server.address)
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


@pytest.fixture
def spair(oracle: Oracle, summarizing: tuple[OurServerProcess, SessionsClient]) -> Pair:
    server, client = summarizing
    pair = Pair(oracle, client, server.data_dir, level="normal")
    pair.ignore_tables.add("config")  # ours persists the policy there (DESIGN §5); upstream never writes it
    return pair


def _chain(pair: Pair, n: int, prefix: str = "m", check: bool = False) -> None:
    for i in range(n):
        pair.append(msg(f"{prefix}{i}", f"turn {i} " + "words " * (i % 5)), check=check)


def _compact_both(pair: Pair, keep_recent: int, leaf: str | None = None) -> None:
    body: dict[str, Any] = {"mode": "reference", "keepRecentTokens": keep_recent}
    if leaf is not None:
        body["leafId"] = leaf
    up = pair.up("compact", body)["result"]
    ours_session = pair.ours()
    ours_session.set_compaction_policy(0, keep_recent_tokens=keep_recent)
    record = ours_session.compact(leaf_id=leaf)
    up_view = None if up is None else (up["fromMessageId"], up["toMessageId"], up["summary"])
    our_view = None if record is None else (record.from_message_id, record.to_message_id, record.summary)
    assert up_view == our_view, f"compact(keepRecentTokens={keep_recent}, leaf={leaf})"
    pair.check()


def test_compact_rpc(spair: Pair) -> None:
    _chain(spair, 5)
    _compact_both(spair, 1)  # too short: null, model not called
    _chain(spair, 8, prefix="n")
    _compact_both(spair, 1)
    _chain(spair, 4, prefix="o")
    _compact_both(spair, 1)  # extends from the visible overlay's start
    _compact_both(spair, 30, leaf="n3")


def _compactions_stored(recorder: Recorder, expected: int, label: str) -> None:
    """Waits until our feed announced `expected` automatic compactions in all (raises if it did
    not within the guard, or announced a failure); more than `expected` fails too."""

    def compacts(events: list[Any]) -> int:
        return sum(1 for e in events if e.type == "compact")

    events = recorder.wait_for(
        lambda events: compacts(events) >= expected or any(e.type == "compaction_error" for e in events),
        f"{label}: {expected} automatic compactions",
    )
    errors = [e.error for e in events if e.type == "compaction_error"]
    assert not errors, f"{label}: automatic compaction failed: {errors}"
    assert compacts(events) == expected, f"{label}: ours compacted {compacts(events)} times, upstream {expected}"


@pytest.mark.parametrize("threshold", [60, 150])
def test_auto_compaction_policy(oracle: Oracle, fake_model: str, tmp_path: Path, threshold: int) -> None:
    """compactAfter(threshold): after each inserted append whose session estimate is strictly over
    the threshold, compact the active branch. Ours runs it in the background: each one is
    waited for by its `compact` event. Its own server: stopping it at the end lets every
    background compaction finish, so the stored records compared then include any extra one."""
    server = SummarizingServer(tmp_path / "data", tmp_path / "server.log", fake_model)
    server.start()
    client = SessionsClient(server.address)
    recorder: Recorder | None = None
    try:
        spair = Pair(oracle, client, server.data_dir, level="normal")
        spair.ignore_tables.add("config")  # ours persists the policy there (DESIGN §5); upstream never writes it
        recorder = Recorder(spair, server.address)
        spair.up("compactAfter", {"threshold": threshold, "mode": "reference", "keepRecentTokens": 1})
        spair.ours().set_compaction_policy(threshold, keep_recent_tokens=1)
        for i in range(24):
            spair.append(msg(f"m{i}", f"turn {i} " + "words " * (i % 7)), check=False)
            expected = len(spair.oracle.sql(spair.key, "SELECT id FROM cf_agents_session_compactions"))
            _compactions_stored(recorder, expected, f"append m{i}")
            assert len(spair.ours().list_compactions()) == expected, f"append m{i}"
            spair.check(level="rows" if i % 4 else "normal")
        assert expected > 0
    finally:
        if recorder is not None:
            recorder.close()
        client.close()
        server.stop()
    # Stopped: every background compaction ours started has stored its record (or was cancelled
    # past the drain, storing nothing). The stored rows, compactions included, are still upstream's.
    assert server.proc is None
    spair.check(level="rows")


def test_compact_rpc_event(spair: Pair, summarizing: tuple[OurServerProcess, SessionsClient]) -> None:
    """A server-side compaction is announced like upstream's compact(): a payload-less `compact`."""
    server, _ = summarizing
    spair.up("events", {})
    recorder = Recorder(spair, server.address)
    try:
        _chain(spair, 12)
        recorder.take_through(recorder.sentinel())
        spair.up("events", {})
        _compact_both(spair, 1)
        sentinel = recorder.sentinel()
        up = [_up_event(e) for e in spair.up("events", {})]
        ours = [_our_event(e) for e in recorder.take_through(sentinel)]
        assert up == ours
        assert [e["type"] for e in up] == ["compact", "append"]
    finally:
        recorder.close()
