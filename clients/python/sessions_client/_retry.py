"""When a failed call is tried again, and after how long; shared by the sync and asyncio clients.

A drain, an object move, a re-shard or a server busy with large messages makes the server refuse
calls for a while without doing anything, and says so (an ErrorInfo reason): those are tried
again whatever the method. A connection that fails (server restarting, proxy unable to reach a
shard, or a proxy that lost its shard under the call and ended it without the server's status,
which the client reports UNAVAILABLE too) leaves the request's fate unknown: only methods that
are safe to repeat are tried again then. So does a call the server's stop cut (CANCELLED without
a reason: gRPC cancels the calls that reached it as it stops, though the drain refused those
before with DRAINING).
Nothing else is tried again: DATA_LOSS with OBJECT_DAMAGED above all (the object's file on the
server is damaged, and stays so until an operator restores or erases it), nor STORAGE_FAILURE.
"""

from __future__ import annotations

import copy
import enum
import numbers
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Self

import grpc

from sessions_client._common import ClientClosed, SessionsError

# (status, ErrorInfo reason) of refusals the server makes before doing anything.
REFUSED_BEFORE_ACTING: Final = frozenset(
    {
        (grpc.StatusCode.UNAVAILABLE, "DRAINING"),
        (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING"),
        (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_NOT_OWNED"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER_BUSY"),
    }
)
# Methods whose repeat, after an attempt that may have been carried out, changes nothing more:
# reads, and writes idempotent by message id or by value (an import skips the ids it holds).
# ClearMessages is not (it would also remove what others appended in between), nor AddCompaction
# and Compact (no id: a second record).
REPEATABLE_METHODS: Final = frozenset(
    {
        "GetMessage",
        "GetMessages",
        "GetLatestLeaf",
        "GetBranches",
        "StreamHistory",
        "GetRecentHistory",
        "GetHistoryRowStats",
        "ReadAttachment",
        "ListCompactions",
        "PlanCompaction",
        "GetCompactionPolicy",
        "SearchMessages",
        "ListSessions",
        "GetObjectStats",
        "AppendMessage",
        "AppendMessages",
        "UploadMessage",
        "UpdateMessage",
        "UpsertMessage",
        "DeleteMessages",
        "SetCompactionPolicy",
        "ImportMessages",
    }
)
# Never tried again by the call layer: a subscription reconnects by itself, resuming after what it
# saw. (An import of items from an iterator is not tried again either, its call says so: the
# items cannot be read twice.)
NOT_REPLAYABLE: Final = frozenset({"Subscribe"})


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how patiently, a failed call is tried again. The wait after failed attempt
    n is `min(max_backoff, initial_backoff * multiplier ** (n - 1))` seconds, times a random
    factor between 0.5 and 1 so that clients refused together do not come back together. The
    defaults wait about 9 s at most over 10 attempts: a server restart or an object move."""

    max_attempts: int = 10
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts counts the first attempt too: at least 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoffs must not be negative, and the multiplier at least 1")

    def backoff(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (1-based), jittered."""
        ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)


DEFAULT_RETRY_POLICY: Final = RetryPolicy()


@dataclass(frozen=True)
class RetryNotice:
    """Given to a client's `on_retry` before each wait: which method failed, on which attempt
    (1-based), with what error, and how long the client waits before the next attempt."""

    method: str
    attempt: int
    error: SessionsError
    delay: float


# gRPC's words for a TLS handshake that failed: the server's certificate not trusted (or not
# valid now, or for another name than the address), refused by the server during the
# handshake, or this client's certificate and key not a pair (no handshake made). The next
# attempt meets the same certificates.
_TLS_FAILURE_WORDS: Final = (
    "handshake failed",
    "certificate_verify_failed",
    "certificate verify failed",
    "hostname verification check failed",
    "failed to create security handshaker",
)


def tls_failed(error: SessionsError) -> bool:
    """Whether `error` is a connection that failed its TLS handshake (never tried again: the
    Go and TypeScript clients do the same). Not a connection closed after it (`closed_before_http2`)."""
    if error.code != grpc.StatusCode.UNAVAILABLE or error.reason:
        return False
    text = error.message.lower()
    return any(words in text for words in _TLS_FAILURE_WORDS)


def closed_before_http2(error: SessionsError, *, tls: bool) -> SessionsError:
    """`error` as a client whose own channel speaks TLS (`tls`) or plaintext raises it, when the
    server closed the connection before it spoke HTTP/2. gRPC then says no more than a closed
    socket, "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:…: Socket
    closed", words it uses only for a connection closed before the server's HTTP/2 SETTINGS,
    which every HTTP/2 server sends first (one closed during a TLS handshake is "Handshake read
    failed (Socket closed)", one closed after the SETTINGS "Stream removed (Socket closed)").
    Over TLS, that is what a server refusing the client's certificate (or its absence) does:
    with TLS 1.3 the client's side of the handshake ends before the server has checked the
    certificate. Over plaintext, it is what a server speaking TLS alone does with the plaintext
    HTTP/2 it reads: it sends nothing back. A proxy in front of a server it cannot reach (one
    restarting) does the same, so such a failure is tried again as any connection's; it says
    what it may be, as the Go and TypeScript clients' do, for when the tries run out."""
    text = error.message
    if (
        error.code != grpc.StatusCode.UNAVAILABLE
        or error.reason
        or not text.startswith("failed to connect to all addresses")
        or not text.endswith(": Socket closed")
    ):
        return error
    explained = (
        f"the server closed the TLS connection before it spoke HTTP/2 ({text}): it may have refused the TLS "
        "handshake, most likely for want of a client certificate it trusts (a server run with "
        "--tls-client-ca requires one: set TlsConfig's certificate_chain and private_key), or a proxy that "
        "ends TLS in front of it could not reach it"
        if tls
        else f"the server closed the connection before it spoke HTTP/2 ({text}): it may speak TLS alone (a "
        "server run with --tls-cert does: give the client tls=TlsConfig(...)), or a proxy in front of it "
        "could not reach it"
    )
    return SessionsError(error.code, explained, None, error.metadata)


def may_retry(method: str, error: SessionsError) -> bool:
    """Whether `method`, failed with `error`, may be tried again (the policy aside)."""
    if method in NOT_REPLAYABLE or tls_failed(error):
        return False
    if (error.code, error.reason) in REFUSED_BEFORE_ACTING:
        return True
    # No reason: the failure came from the connection or a proxy, not from this service; so did
    # a CANCELLED the client did not make (its calls cannot be cancelled but by its close: a
    # timeout is DEADLINE_EXCEEDED, an asyncio task's cancellation no RpcError).
    return not error.reason and method in REPEATABLE_METHODS and _connection_failed(error)


def resubscribe_delay(attempt: int) -> float:
    """The wait before a subscription's reconnection `attempt` (1-based): 0.1 s doubling to 2 s,
    times a random factor from 0.5 to 1, so that the subscribers of a server that went away do
    not all come back at the same instant."""
    return min(2.0, 0.05 * 2.0 ** min(attempt, 6)) * random.uniform(0.5, 1.0)  # 3.2 s at 6: no overflow past it


def may_resubscribe(error: SessionsError) -> bool:
    """Whether a subscription resumes after `error` (a resume repeats nothing): the server went
    away (UNAVAILABLE, a CANCELLED it made), refused before acting (draining, the object moving
    or moved: a proxy routes the resume to its new owner), or a proxy ended the stream with a
    status of its own (UNKNOWN, no reason; one that ended it without any status is UNAVAILABLE
    already, `ended_without_status`).
    Not after a failed TLS handshake: the next one would fail alike."""
    if tls_failed(error):
        return False
    if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return True
    if (error.code, error.reason) in REFUSED_BEFORE_ACTING:
        return True
    return error.code == grpc.StatusCode.UNKNOWN and not error.reason


def _connection_failed(error: SessionsError) -> bool:
    if error.code == grpc.StatusCode.CANCELLED:
        return not isinstance(error, ClientClosed)
    return error.code == grpc.StatusCode.UNAVAILABLE


class Attempts:
    """One call's attempts: the time left before its deadline, and the wait before the next."""

    def __init__(
        self,
        method: str,
        policy: RetryPolicy | None,
        on_retry: Callable[[RetryNotice], None] | None,
        timeout: float | None,
        *,
        retryable: Callable[[SessionsError], bool] | None = None,
    ) -> None:
        """`retryable`: which failures may be tried again (by default `may_retry`'s rule for
        `method`), for a call with a rule of its own."""
        self.method = method
        self._retryable = retryable or (lambda error: may_retry(method, error))
        self._policy = policy
        self._on_retry = on_retry
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self.count = 0

    def remaining(self) -> float | None:
        """The timeout for the next attempt: the call's deadline covers every attempt and wait."""
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.0)

    def begin(self) -> None:
        self.count += 1

    def wait_after(self, error: SessionsError) -> float | None:
        """Seconds to wait before trying again after `error`, or None to give up and raise it."""
        policy = self._policy
        if policy is None or self.count >= policy.max_attempts or not self._retryable(error):
            return None
        delay = policy.backoff(self.count)
        if self._deadline is not None and time.monotonic() + delay >= self._deadline:
            return None  # the next attempt would start past the deadline
        if self._on_retry is not None:
            self._on_retry(RetryNotice(self.method, self.count, error, delay))
        return delay


class Unchanged(enum.Enum):
    """`with_options`' default: the option keeps this client's value."""

    UNCHANGED = "unchanged"


UNCHANGED: Final = Unchanged.UNCHANGED


# The longest call timeout taken: gRPC failed calls with a deadline of 1e10 s at once.
MAX_TIMEOUT_SECONDS: Final = 1e9


class CallOptions:
    """The per-call settings of a client (`timeout`, `retry`, `on_retry`) and views of the client
    with others; mixed into the sync and asyncio clients."""

    retry: RetryPolicy | None
    on_retry: Callable[[RetryNotice], None] | None
    _timeout: float | None = None
    _owns_channel: bool = True
    _is_view: bool = False  # made by `with_options`: the client it views closes the connection

    @property
    def timeout(self) -> float | None:
        """Seconds that bound each call, its retries included; None: no deadline."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        # A deadline of 0 failed every call at once, where Go's WithCallTimeout(0) is none, and so
        # did one past gRPC's reach (1e10 s): refused.
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"timeout must be a number of seconds, or None for no deadline; got {value!r}")
            if not 0 < float(value) <= MAX_TIMEOUT_SECONDS:
                raise ValueError(
                    f"timeout must be greater than 0 seconds and at most {MAX_TIMEOUT_SECONDS:.0e}, or None for no "
                    f"deadline; got {value!r}"
                )
        self._timeout = value

    def with_options(
        self,
        *,
        timeout: float | Unchanged | None = UNCHANGED,
        retry: RetryPolicy | Unchanged | None = UNCHANGED,
        on_retry: Callable[[RetryNotice], None] | Unchanged | None = UNCHANGED,
    ) -> Self:
        """This client with other call options, on the same connection: e.g.
        `client.with_options(timeout=2.0, retry=None)` for calls that must answer at once, while
        the client itself keeps its own. Closing the view leaves the connection open (it is the
        client's to close); the client's options do not change."""
        view = copy.copy(self)
        view._is_view = True
        if not isinstance(timeout, Unchanged):
            view.timeout = timeout
        if not isinstance(retry, Unchanged):
            view.retry = retry
        if not isinstance(on_retry, Unchanged):
            view.on_retry = on_retry
        return view
