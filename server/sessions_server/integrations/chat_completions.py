"""A summarizer backed by an OpenAI-compatible chat-completions endpoint.

POST `<base_url>/chat/completions` with one user message holding the compaction prompt; the
summary is the first choice's message content. The API key is read from an environment variable
named by configuration (never from a flag, so it stays out of process listings). The blocking
HTTP call runs on a thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from sessions_server.domain.jsjson import well_formed

# A reply is read into memory whole: one past this is refused unread (a summary is 1 MiB at most
# by default; the JSON around it is small).
MAX_REPLY_BYTES = 16 * 1024 * 1024


def _settle(answer: asyncio.Future[str], value: str | None, error: BaseException | None) -> None:
    if answer.done():  # the caller was cancelled
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(value or "")


class SummarizerError(Exception):
    """The endpoint failed, timed out, or answered something that is not a summary."""


# Model calls waiting at once (each holds a thread for up to its timeout); more wait their turn.
CALLS_AT_ONCE = 4


@dataclass(frozen=True)
class ChatCompletionsSummarizer:
    base_url: str
    model: str
    api_key_env: str = "SESSIONS_SUMMARIZER_API_KEY"
    timeout_seconds: float = 60.0
    _slots: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(CALLS_AT_ONCE), repr=False, compare=False
    )

    async def summarize(self, prompt: str) -> str:
        # Each call on a daemon thread of its own, not asyncio's default executor: slow model
        # calls took every thread that listing, deleting and importing objects run on
        # (ListObjects waited 29 s behind 12 of them), and a call still waiting when the server
        # stops must not hold the process's exit for the rest of its timeout.
        async with self._slots:
            loop = asyncio.get_running_loop()
            answer: asyncio.Future[str] = loop.create_future()

            def call() -> None:
                try:
                    outcome: tuple[str | None, BaseException | None] = (self._call(prompt), None)
                except BaseException as exc:  # handed to the awaiting task
                    outcome = (None, exc)
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                    loop.call_soon_threadsafe(_settle, answer, *outcome)

            threading.Thread(target=call, name="summarizer", daemon=True).start()
            try:
                # urllib's timeout bounds each socket operation, not the call: an endpoint that
                # answers a byte at a time would hold it (and a slot) for as long as it liked.
                return await asyncio.wait_for(answer, self.timeout_seconds)
            except TimeoutError:
                raise SummarizerError(f"summarizer timed out: no answer within {self.timeout_seconds:g} s") from None

    def _call(self, prompt: str) -> str:
        request_body = {"model": self.model, "messages": [{"role": "user", "content": prompt}]}
        try:
            body = json.dumps(request_body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in the prompt: escaped, as JSON.stringify does
            body = json.dumps(request_body).encode("ascii")
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(
            self.base_url.rstrip("/") + "/chat/completions", data=body, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                reply = response.read(MAX_REPLY_BYTES + 1)
            if len(reply) > MAX_REPLY_BYTES:
                raise SummarizerError(f"summarizer answered more than {MAX_REPLY_BYTES} bytes")
            payload = json.loads(reply.decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise SummarizerError(f"summarizer answered HTTP {exc.code}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise SummarizerError(f"summarizer unreachable or timed out: {exc}") from None
        except ValueError:
            raise SummarizerError("summarizer answered something that is not JSON") from None
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise SummarizerError("summarizer answer has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise SummarizerError("summarizer content is not text")
        return well_formed(content)  # a lone surrogate (escaped in JSON) could be neither stored nor sent
