"""A summarizer backed by an OpenAI-compatible chat-completions endpoint.

POST `<base_url>/chat/completions` with one user message holding the compaction prompt; the
summary is the first choice's message content. The API key is read from an environment variable
named by configuration (never from a flag, so it stays out of process listings). The blocking
HTTP call runs on a thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass

# A reply is read into memory whole: one past this is refused unread (a summary is 1 MiB at most
# by default; the JSON around it is small).
MAX_REPLY_BYTES = 16 * 1024 * 1024


class SummarizerError(Exception):
    """The endpoint failed, timed out, or answered something that is not a summary."""


@dataclass(frozen=True)
class ChatCompletionsSummarizer:
    base_url: str
    model: str
    api_key_env: str = "SESSIONS_SUMMARIZER_API_KEY"
    timeout_seconds: float = 60.0

    async def summarize(self, prompt: str) -> str:
        return await asyncio.to_thread(self._call, prompt)

    def _call(self, prompt: str) -> str:
        body = json.dumps(
            {"model": self.model, "messages": [{"role": "user", "content": prompt}]}, ensure_ascii=False
        ).encode("utf-8")
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
        return content
