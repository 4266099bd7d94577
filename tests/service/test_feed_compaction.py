"""Change events of server-side compaction (reference notes §9, DESIGN.md §7): `compact` when the
server's summarizer stored an overlay (payload `{sessionId}` only, as upstream), automatic
compaction after appends past the session's threshold, and `compaction_error` when the summarizer
fails, while the append that triggered it still succeeds.

The summarizer is a fake OpenAI-compatible endpoint on a loopback port.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sessions_client import SessionsClient
from tests.service.support import text_message
from tests.service.test_feed import Feed


@dataclass
class FakeSummarizer:
    """Answers chat completions with `summary`, or with HTTP `status` when it is not 200."""

    summary: str = "the fake summary"
    status: int = 200
    prompts: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> FakeSummarizer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.prompts.append(body["messages"][0]["content"])
                if fake.status != 200:
                    self.send_response(fake.status)
                    self.end_headers()
                    return
                answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": fake.summary}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, name="fake-summarizer", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def summarizer() -> Iterator[FakeSummarizer]:
    fake = FakeSummarizer().start()
    yield fake
    fake.stop()


@pytest.fixture
def summarizing_server(tmp_path: Path, summarizer: FakeSummarizer) -> Iterator[Any]:
    from tests.conftest import start_server

    server = start_server(tmp_path / "data", summarizer_url=summarizer.url)
    yield server
    server.stop()


def turns(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        text_message(f"m{i}", f"turn {i}: " + "words " * 30, role="user" if i % 2 == 0 else "assistant")
        for i in range(start, start + count)
    ]


def test_server_side_compact_emits_compact_without_a_record(summarizing_server: Any) -> None:
    with SessionsClient(summarizing_server.address) as client:
        session = client.object("compacting").session("s")
        session.append_messages(turns(12))
        session.set_compaction_policy(0, keep_recent_tokens=1)
        feed = Feed(summarizing_server.address, "compacting")
        try:
            record = session.compact()
            assert record is not None and record.summary == "the fake summary"

            event = feed.next()
            assert (event.type, event.session_id, event.message, event.compaction) == ("compact", "s", None, None)
        finally:
            feed.close()


def test_automatic_compaction_past_the_threshold_emits_compact_after_the_appends(summarizing_server: Any) -> None:
    with SessionsClient(summarizing_server.address) as client:
        session = client.object("auto").session()
        session.append_messages(turns(12))
        session.set_compaction_policy(1, keep_recent_tokens=1)
        feed = Feed(summarizing_server.address, "auto")
        try:
            session.append_message(text_message("trigger", "one more"))

            appended = feed.next()
            assert (appended.type, appended.message and appended.message["id"]) == ("append", "trigger")
            compacted = feed.next()
            assert compacted.type == "compact"
            assert compacted.revision > appended.revision
            assert [r.summary for r in session.list_compactions()] == ["the fake summary"]
        finally:
            feed.close()


def test_a_failing_summarizer_emits_compaction_error_and_the_append_succeeds(
    summarizing_server: Any, summarizer: FakeSummarizer
) -> None:
    summarizer.status = 500
    with SessionsClient(summarizing_server.address) as client:
        session = client.object("failing").session("s")
        session.append_messages(turns(12))
        session.set_compaction_policy(1, keep_recent_tokens=1)
        feed = Feed(summarizing_server.address, "failing")
        try:
            assert session.append_message(text_message("trigger", "one more")).inserted

            appended = feed.next()
            assert (appended.type, appended.message and appended.message["id"]) == ("append", "trigger")
            failed = feed.next()
            assert (failed.type, failed.session_id, failed.message) == ("compaction_error", "s", None)
            assert "500" in failed.error
            assert summarizer.prompts  # the summarizer was really asked
            assert session.get_message("trigger") is not None
            assert session.list_compactions() == []
        finally:
            feed.close()
