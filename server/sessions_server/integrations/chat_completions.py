"""A summarizer backed by an OpenAI-compatible chat-completions endpoint.

POST `<base_url>/chat/completions` with one user message holding the compaction prompt; the
summary is the first choice's message content. The API key is read from an environment variable
named by configuration (never from a flag, so it stays out of process listings). The blocking
HTTP call runs on a thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import re
import socket
import sys
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from sessions_server.domain.jsjson import well_formed

# A reply is read into memory whole: one past this is refused unread (a summary is 1 MiB at most
# by default; the JSON around it is small).
MAX_REPLY_BYTES = 16 * 1024 * 1024

# Of a refusal's body, what is read (for its message) and what is quoted of it.
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_ERROR_QUOTE_CHARS = 300

# What urllib, which made these calls before, sent.
USER_AGENT = f"Python-urllib/{sys.version_info[0]}.{sys.version_info[1]}"


def _settle(answer: asyncio.Future[str], value: str | None, error: BaseException | None) -> None:
    if answer.done():  # the caller was cancelled
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(value or "")


class SummarizerError(Exception):
    """The endpoint failed, timed out, or answered something that is not a summary."""


# Model calls at once, abandoned ones included: a call's slot is freed only when its thread has
# closed its connection; more wait their turn, within their timeout.
CALLS_AT_ONCE = 4


class _Connection:
    """One model call's connection, shared by the thread that makes the call and the event loop,
    which shuts it down when the call is abandoned (its caller cancelled, or out of time): the
    thread, blocked on the socket, then returns at once instead of when the endpoint lets it.

    The loop shuts the connection down through a duplicate of its socket that only this object
    closes, after the thread is done: http.client's own socket is wrapped in TLS (which takes
    its descriptor over) and closed as it sees fit, so its descriptor could be another file's
    by the time the loop used it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handle: socket.socket | None = None
        self._abandoned = False

    def abandon(self) -> None:
        """On the loop: stops the call, now or as soon as it has a socket."""
        with self._lock:
            self._abandoned = True
            if self._handle is not None:
                with contextlib.suppress(OSError):
                    self._handle.shutdown(socket.SHUT_RDWR)

    def open(
        self, address: tuple[str, int], timeout: float | None, source_address: tuple[str, int] | None = None
    ) -> socket.socket:
        """`socket.create_connection` for http.client, each socket shut down as soon as the call
        is abandoned, connecting or not. Name resolution, which nothing interrupts, is bounded by
        the resolver's own timeouts only."""
        host, port = address
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                self._attach(sock)
                sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                self._attach(None)  # abandoned before it could be shut down: stop here
                return sock
            except OSError as exc:
                sock.close()
                self.close()
                if self._abandoned:
                    raise
                error = exc
        raise error if error is not None else OSError(f"no address for {host}")

    def _attach(self, sock: socket.socket | None) -> None:
        with self._lock:
            if self._abandoned:
                raise ConnectionAbortedError("the summarizer call was abandoned")
            if sock is not None:
                self._handle = sock.dup()

    def close(self) -> None:
        """In the thread, once it is done with the connection."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


def _finish(
    slots: asyncio.Semaphore, answer: asyncio.Future[str], value: str | None, error: BaseException | None
) -> None:
    slots.release()
    _settle(answer, value, error)


def base_url_problem(base_url: str) -> str | None:
    """What keeps `base_url` from naming a chat-completions endpoint (None: nothing). Checked at
    the start, as a call would otherwise go wrong only at the first compaction: a port past
    65,535 was wrapped by the resolver onto another port (the API key and the conversation went
    to whatever listened there), a fragment swallowed the path, and credentials in the URL were
    taken for part of the host."""
    if any(c.isspace() or not c.isprintable() for c in base_url):
        return "a URL holding spaces or control characters"
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018 - reading it checks it (a number from 0 to 65,535)
    except ValueError:
        return "no http or https URL with a host and a port from 1 to 65535"
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return "no http or https URL with a host"
    if parts.port == 0:
        return "no http or https URL with a host and a port from 1 to 65535"
    if parts.username is not None or parts.password is not None:
        return "a URL holding credentials: give the API key in the variable --summarizer-api-key-env names"
    if parts.fragment or base_url.endswith("#"):
        return "a URL with a fragment (#...): the path after it would never be sent"
    return None


def without_credentials(url: str) -> str:
    """`url` with everything from its `//` to its last `@` shown as `***`: a refusal quotes the
    URL, and a password must not reach the logs that keep it, even one holding a `/`, `?` or
    `#` that a URL parser takes for the end of the authority."""
    return re.sub(r"^([^:/?#]*:)?//.*@", lambda m: f"{m.group(1) or ''}//***@", url, count=1, flags=re.DOTALL)


def completions_url(base_url: str) -> str:
    """`<base_url>/chat/completions`, a query the base URL holds kept after the path (an
    `api-version`, say)."""
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions"))


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
        #
        # The timeout covers the whole call, the wait for a slot included: a socket timeout
        # bounds each socket operation, not the call (an endpoint answering a byte at a time
        # would hold it, and a slot, for as long as it liked). A call abandoned (cancelled, or
        # out of time) has its connection shut down at once; its slot is freed when its thread
        # has ended, so abandoned calls never add to the CALLS_AT_ONCE under way.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_seconds
        try:
            async with asyncio.timeout_at(deadline):
                await self._slots.acquire()
        except TimeoutError:
            raise SummarizerError(f"summarizer timed out: no answer within {self.timeout_seconds:g} s") from None
        # The slot is the thread's from here: it frees it as it ends, its connection closed (should
        # the loop be gone by then, so is everything that waited for a slot).
        answer: asyncio.Future[str] = loop.create_future()
        connection = _Connection()

        def call() -> None:
            try:
                outcome: tuple[str | None, BaseException | None] = (self._call(prompt, connection), None)
            except BaseException as exc:  # handed to the awaiting task
                outcome = (None, exc)
            finally:
                connection.close()
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(_finish, self._slots, answer, *outcome)

        try:
            threading.Thread(target=call, name="summarizer", daemon=True).start()
        except BaseException:
            self._slots.release()
            raise
        try:
            async with asyncio.timeout_at(deadline) as budget:
                return await answer
        except TimeoutError:
            if not budget.expired():
                raise
            raise SummarizerError(f"summarizer timed out: no answer within {self.timeout_seconds:g} s") from None
        finally:
            if not answer.done() or answer.cancelled():
                connection.abandon()

    def _call(self, prompt: str, connection: _Connection) -> str:
        request_body = {"model": self.model, "messages": [{"role": "user", "content": prompt}]}
        try:
            body = json.dumps(request_body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in the prompt: escaped, as JSON.stringify does
            body = json.dumps(request_body).encode("ascii")
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Connection": "close"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn, target = _connect(completions_url(self.base_url), headers, connection, self.timeout_seconds)
        try:
            try:
                conn.request("POST", target, body=body, headers=headers)
                with conn.getresponse() as response:  # closing it closes the socket
                    if not 200 <= response.status < 300:
                        try:
                            said = _error_said(response.read(MAX_ERROR_BODY_BYTES))
                        except (http.client.HTTPException, OSError):  # the status says enough
                            said = ""
                        raise SummarizerError(f"summarizer answered HTTP {response.status}{said}")
                    reply = response.read(MAX_REPLY_BYTES + 1)
            finally:
                conn.close()
            if len(reply) > MAX_REPLY_BYTES:
                raise SummarizerError(f"summarizer answered more than {MAX_REPLY_BYTES} bytes")
            payload = json.loads(reply.decode("utf-8"))
        except (http.client.HTTPException, OSError) as exc:  # TimeoutError is an OSError
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


def _error_said(body: bytes) -> str:
    """ ": <what the endpoint said>" for a refusal's body ("" when it said nothing): OpenAI's
    `error.message` when the body is its JSON, else the text, on one line and cut short. A 400
    for a prompt past the model's context, a 401 for a wrong key and a 404 for a wrong model
    all read "HTTP 4xx" alone before."""
    text = body.decode("utf-8", errors="replace")
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message.strip():
            text = message
    except (ValueError, AttributeError):
        pass
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(text) > MAX_ERROR_QUOTE_CHARS:
        text = text[: MAX_ERROR_QUOTE_CHARS - 1] + "…"
    return f": {text}" if text else ""


def _connect(
    url: str, headers: dict[str, str], connection: _Connection, timeout: float
) -> tuple[http.client.HTTPConnection, str]:
    """An unopened connection for `url` and the request target to send, through the proxy the
    environment names for its scheme unless `no_proxy` exempts its host, as urllib did
    (`https` tunnelled with CONNECT, its TLS to the endpoint; `http` sent to the proxy whole).
    `headers` gets the proxy's credentials when they go with the request."""
    if (problem := base_url_problem(url)) is not None:
        raise SummarizerError(f"summarizer URL {url!r} is {problem}")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind: type[http.client.HTTPConnection] = (
        http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    )
    host, tunnel, proxy_headers = parts.netloc, None, {}
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and not urllib.request.proxy_bypass(parts.netloc):
        proxied = urllib.parse.urlsplit(proxy if "://" in proxy else f"//{proxy}")
        host = urllib.parse.unquote(proxied.netloc.rpartition("@")[2])
        if proxied.username and proxied.password:
            credentials = f"{urllib.parse.unquote(proxied.username)}:{urllib.parse.unquote(proxied.password)}"
            proxy_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
        if scheme == "https":
            tunnel = parts.netloc
        else:
            proxy_scheme = (proxied.scheme or "http").lower()
            if proxy_scheme not in ("http", "https"):
                raise SummarizerError(f"summarizer proxy is neither http nor https: {proxy_scheme}")
            kind = http.client.HTTPSConnection if proxy_scheme == "https" else http.client.HTTPConnection
            target = urllib.parse.urlunsplit(parts._replace(fragment=""))
            headers.update(proxy_headers)
    # Each socket operation's timeout, as urllib's was; the call's own is the loop's to keep (it
    # shuts the connection down when that runs out), this one a backstop should the loop be gone.
    conn = kind(host, timeout=timeout)
    # http.client's hook for opening the socket (it then sets the socket up, tunnels and wraps
    # it in TLS as usual): each socket is the call's to shut down.
    conn._create_connection = connection.open  # type: ignore[attr-defined]
    if tunnel is not None:
        conn.set_tunnel(tunnel, headers=proxy_headers)
    return conn, target
