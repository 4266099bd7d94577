"""Helpers for the compaction tests: a real local HTTP server speaking the OpenAI chat-completions
protocol, and a change-feed reader bounded by a deadline (so a missing event fails the test
instead of hanging it).

`ChatCompletionsStub` listens on 127.0.0.1:0 and answers `POST <base>/chat/completions` with a
deterministic summary. It can be switched to fail with HTTP 500, to return empty content, to
hold the request open until released (longer than the server's summarizer timeout), to hold
it until released and then answer, or to answer a byte at a time. Every request
body and its headers are recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sessions_client import ChangeEvent, SessionsClient

GUARD_SECONDS = 30.0  # upper bound on any wait; a correct server answers in milliseconds

OK = "ok"
FAIL = "fail"  # HTTP 500
EMPTY = "empty"  # 200 with whitespace-only content
HANG = "hang"  # hold the request until `release()` (or the stub stops)
HOLD = "hold"  # hold the request until `release()`, then answer as OK does
DRIP = "drip"  # answer as OK does, a byte every DRIP_PAUSE seconds until `release()`
DRIP_PAUSE = 0.1


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def prompt(self) -> str:
        return str(self.body["messages"][0]["content"])


@dataclass
class ChatCompletionsStub:
    """A chat-completions endpoint. Replies `summary #<n>` (n counts requests from 1) unless
    `content` is set."""

    mode: str = OK
    content: str | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _released: threading.Event = field(default_factory=threading.Event)
    _seen: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        """The base URL to configure (`summarizer_url`); requests go to `<url>/chat/completions`."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ChatCompletionsStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length).decode("utf-8"))
                with stub._lock:
                    stub.requests.append(RecordedRequest(self.path, dict(self.headers.items()), body))
                    number = len(stub.requests)
                    mode = stub.mode
                with stub._seen:
                    stub._seen.notify_all()
                if self.path != "/v1/chat/completions":
                    self._answer(404, {"error": {"message": "not found"}})
                    return
                if mode == HANG:
                    stub._released.wait(GUARD_SECONDS)
                    return  # close without answering
                if mode == HOLD:
                    stub._released.wait(GUARD_SECONDS)
                if mode == FAIL:
                    self._answer(500, {"error": {"message": "stub failure"}})
                    return
                text = (
                    "   \n" if mode == EMPTY else (stub.content if stub.content is not None else f"summary #{number}")
                )
                self._answer(
                    200,
                    drip=mode == DRIP,
                    payload={
                        "id": f"chatcmpl-{number}",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ],
                    },
                )

            def _answer(self, status: int, payload: dict[str, Any], *, drip: bool = False) -> None:
                data = json.dumps(payload).encode("utf-8")
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    while drip and data and not stub._released.wait(DRIP_PAUSE):
                        self.wfile.write(data[:1])
                        self.wfile.flush()
                        data = data[1:]
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=lambda: self._server.serve_forever(poll_interval=0.02), name="chat-completions-stub", daemon=True
        ).start()
        return self

    def release(self) -> None:
        """Lets held (HANG) requests finish."""
        self._released.set()

    def wait_for_requests(self, count: int) -> list[RecordedRequest]:
        """Blocks until at least `count` requests arrived (bounded by GUARD_SECONDS)."""
        with self._seen:
            arrived = self._seen.wait_for(lambda: len(self.requests) >= count, timeout=GUARD_SECONDS)
        assert arrived, f"the summarizer got {len(self.requests)} requests, expected {count}"
        return list(self.requests)

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class FeedReader:
    """A live subscription read on the calling thread; the stream has a deadline, so waiting for
    an event that never comes fails with DEADLINE_EXCEEDED instead of hanging."""

    def __init__(self, address: str, object_key: str, *, session_id: str | None = None, pointers: bool = False):
        self._client = SessionsClient(address, timeout=GUARD_SECONDS)
        self._events: Iterator[ChangeEvent] = self._client.object(object_key).subscribe(
            session_id=session_id, pointers=pointers, include_progress=True, reconnect_attempts=0
        )
        first = next(self._events)  # a live stream starts with a progress event: it is subscribed
        assert first.type == "progress", first
        self.seen: list[ChangeEvent] = []

    def next(self) -> ChangeEvent:
        """The next event other than progress."""
        while True:
            event = next(self._events)
            if event.type != "progress":
                self.seen.append(event)
                return event

    def until(self, *types: str) -> ChangeEvent:
        """Reads events until one of `types` arrives; returns it (the others are in `seen`)."""
        while True:
            event = self.next()
            if event.type in types:
                return event

    def close(self) -> None:
        close = getattr(self._events, "close", None)
        if close is not None:
            close()
        self._client.close()

    def __enter__(self) -> FeedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
