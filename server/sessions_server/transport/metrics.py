"""Prometheus metrics, request ids and the access log.

Every RPC is timed and counted by service, method, status code and the ErrorInfo reason it was
refused with (`CallMeter`); gauges and counters describe the objects (open, row writes,
subscribers, compactions). `--metrics-listen HOST:PORT` serves them over HTTP for Prometheus, at
`/metrics` (any other path: 404). Each call gets a request id (the caller's `x-request-id`
metadata, or a fresh one) that log lines carry. Every call ends with a line of the
`sessions.access` logger at DEBUG (off unless that logger is enabled), and every refusal by the
token check with a rate-limited WARNING of `sessions.auth` (`auth.RefusalLog`).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import UTC, datetime
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from sessions_proto.v1 import sessions_pb2
from sessions_server import version
from sessions_server.domain import keys
from sessions_server.transport.auth import RefusalLog

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
# The call being served (its servicer context): what gRPC logs about the call after its handler,
# in the handler's task, can ask whether its deadline passed. Asked then only, not on every call.
serving: contextvars.ContextVar[Any] = contextvars.ContextVar("serving", default=None)
# gRPC's core and Python's clock may differ by a little as the deadline passes.
DEADLINE_SLACK_SECONDS = 0.01
# An answer this much past its call's deadline is counted as the client saw it, DEADLINE_EXCEEDED:
# gRPC acts on a deadline when its timer fires, and an answer made in the few milliseconds before
# still reaches the client (30 of 400 calls with 0.2-2 ms deadlines were counted so wrongly).
LATE_ANSWER_SECONDS = 0.02


def _deadline_passed() -> bool:
    return _deadline_passed_for(serving.get())


def _deadline_passed_for(context: Any) -> bool:
    remaining = None if context is None else context.time_remaining()
    return remaining is not None and remaining <= DEADLINE_SLACK_SECONDS


# The path the endpoint serves the metrics at; every other path is answered 404.
METRICS_PATH = "/metrics"


class Metrics:
    """The server's metrics in their own registry (tests may run several servers)."""

    def __init__(self) -> None:
        # No `*_created` series beside each counter and histogram (they doubled the series count,
        # and Prometheus reads a reset from the counter itself). Process-wide in prometheus_client.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
        self.registry = CollectorRegistry()
        self._endpoint: WSGIServer | None = None
        GCCollector(registry=self.registry)  # python_gc_collections_total by generation
        # process_resident_memory_bytes, process_open_fds and process_max_fds among them: what
        # the operations guide sizes memory and the open-objects bound by.
        ProcessCollector(registry=self.registry)
        Info("sessions_build", "The server's version", registry=self.registry).info({"version": version()})
        self.rpcs = Counter(
            "sessions_rpcs",
            "RPCs finished, by service, method, status code and the ErrorInfo reason of a refusal (one of "
            "the contract's ErrorReason names, or OTHER; empty for OK and for a status without ErrorInfo)",
            ["service", "method", "code", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "sessions_rpc_seconds",
            "RPC duration by service and method (streams: until the last frame)",
            ["service", "method"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.open_objects = Gauge("sessions_open_objects", "Objects currently open", registry=self.registry)
        # Named sessions_row_writes until the counter below: a counter's family takes the name
        # without `_total`, and one name for two families is refused (OpenMetrics, the registry).
        self.row_writes = Gauge(
            "sessions_open_object_row_writes",
            "Rows written (as upstream bills them) over their lifetime, as their files count them, by the objects "
            "open now: it drops as objects close; for a rate, sessions_row_writes_total",
            registry=self.registry,
        )
        self.row_writes_total = RowWritesTotal(self.registry)
        self.bytes_stored = Gauge("sessions_open_object_bytes", "Bytes of open object files", registry=self.registry)
        self.free_bytes = Gauge(
            "sessions_data_dir_free_bytes",
            "Bytes free to the server on the file system of its data directory (writes fail STORAGE_FULL "
            "when they run out; a vacuum, an export or a move needs room for a copy of its object)",
            registry=self.registry,
        )
        self.subscribers = Gauge("sessions_subscribers", "Active Subscribe streams", registry=self.registry)
        self.feed_retained_bytes = Gauge(
            "sessions_feed_retained_bytes",
            "Bytes of change events open objects keep for resuming subscribers (limit: --feed-retain-total-bytes)",
            registry=self.registry,
        )
        self.searches_running = Gauge(
            "sessions_searches_running",
            "Searches running now (limit: --max-concurrent-searches)",
            registry=self.registry,
        )
        self.searches_waiting = Gauge(
            "sessions_searches_waiting", "Searches waiting for one of the running ones to end", registry=self.registry
        )
        self.assembly_bytes = Gauge(
            "sessions_assembly_bytes",
            "Bytes of messages held while their pieces arrive or while they are written (limit: --max-assembly-bytes)",
            registry=self.registry,
        )
        self.small_write_bytes = Gauge(
            "sessions_small_write_bytes",
            "Bytes of unary writes of up to 1 MiB held while they are written, charged to a pool of their "
            "own (an eighth of --max-assembly-bytes, at most 64 MiB) beside sessions_assembly_bytes",
            registry=self.registry,
        )
        self.memo_bytes = Gauge(
            "sessions_memo_bytes",
            "Memory kept of recent reads and writes to serve the next ones, by kind: remembered read paths "
            "(paths, at most 64 MiB), messages (messages, --message-memo-bytes) and the packed history "
            "responses sent (responses, a third of --message-memo-bytes)",
            ["kind"],
            registry=self.registry,
        )
        self.calls_in_flight = Gauge(
            "sessions_rpcs_in_flight",
            "Calls being handled, except change feeds (Subscribe, health Watch) and bidirectional streams",
            registry=self.registry,
        )
        self.held_plans = Gauge(
            "sessions_held_compaction_plans",
            "Compaction plans (PlanCompaction) held for the summary their client makes, each watching its "
            "object's commits until used or let go (at most 1,024 a caller's token, for 15 minutes)",
            registry=self.registry,
        )
        self.compactions = Counter(
            "sessions_compactions", "Compaction overlays stored", ["kind"], registry=self.registry
        )
        self.heap_releases = Counter(
            "sessions_heap_releases",
            "Times the server, gone idle, handed free heap memory back to the operating system",
            registry=self.registry,
        )

    def serve(self, listen: str) -> None:
        """Serves the registry over HTTP on `listen`, at METRICS_PATH, until `close`."""
        host, _, port = listen.rpartition(":")
        self._endpoint = _start_endpoint(host or "127.0.0.1", int(port), _metrics_only(make_wsgi_app(self.registry)))

    def close(self) -> None:
        """Stops the HTTP endpoint and gives its port back (a server stopped in-process, or one
        that failed to start, must not keep answering for a closed registry)."""
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.shutdown()
            endpoint.server_close()


class RowWritesTotal(Collector):
    """`sessions_row_writes_total`: rows written (as upstream bills them) by this process since
    it started, a counter (`rate()` works), where `sessions_open_object_row_writes` sums what
    the open objects' files count over their lifetime and drops with every close.

    `set_function(written)` gives the source: a count of this process's row writes, closed objects'
    included (the object registry's). Until one is given, the series is left out rather than
    shown wrong. The value shown never goes down, should the source ever dip for a moment (an
    object between open and closed as it is read from another thread)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._written: Callable[[], int] | None = None
        self._highest = 0
        self._lock = threading.Lock()
        registry.register(self)

    def set_function(self, written: Callable[[], int]) -> None:
        self._written = written

    def collect(self) -> Iterator[Metric]:
        written = self._written
        if written is None:
            return
        with self._lock:  # scrapes may come at once, each on a thread of its own
            self._highest = max(self._highest, int(written()))
            value = self._highest
        yield CounterMetricFamily(
            "sessions_row_writes",
            "Rows written (as upstream bills them) by this process since it started, closed objects' included",
            value=value,
        )

    def describe(self) -> Iterable[Metric]:
        return ()  # the collector's family shows only once it has a source


def _metrics_only(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """`app` at METRICS_PATH, and 404 on every other path (every path answered the metrics)."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"not found: the metrics are at {METRICS_PATH}\n".encode()]

    return serve


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """A thread per request, none of them holding the process up as it exits."""

    daemon_threads = True


class _SilentHandler(WSGIRequestHandler):
    """Logs no line per scrape (on stderr, past the log's handlers and format)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _start_endpoint(host: str, port: int, app: Callable[..., Iterable[bytes]]) -> WSGIServer:
    """prometheus_client's `start_http_server`, with our own app: an HTTP server on a daemon
    thread, of the address family `host` is."""
    family, _, _, _, address = next(
        iter(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))
    )

    class Endpoint(_ThreadingWSGIServer):
        address_family = family

    server = make_server(str(address[0]), port, app, Endpoint, handler_class=_SilentHandler)
    threading.Thread(target=server.serve_forever, name="metrics-endpoint", daemon=True).start()
    return server


# A request id is this process's random prefix and a call counter: unique per call, and cheap
# (a uuid4 per call took 2% of the event loop under 16 concurrent writers).
_REQUEST_ID_PREFIX = os.urandom(4).hex()
_request_numbers = itertools.count(1)


# A caller's id goes into every log line of its call: metadata values run to the header limit
# (8 KiB and more), which a caller could otherwise copy into each line (security audit).
MAX_REQUEST_ID_CHARS = 128
# ... and only characters ids are made of: with spaces and brackets, an id wrote what read as
# another call into a text log line ("x]: SessionService/DeleteObject OK ... peer=... [").
_NOT_IN_REQUEST_IDS = re.compile(r"[^A-Za-z0-9._~:/+=@-]")


def _caller_request_id(incoming: object) -> str:
    return _NOT_IN_REQUEST_IDS.sub("_", str(incoming)[:MAX_REQUEST_ID_CHARS])


def _fresh_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers) & 0xFFFFFFFF:08x}"


# Streams that stay open idle for as long as a client likes: they do not make the server busy.
CHANGE_FEEDS = frozenset({"/sessions.v1.SessionService/Subscribe", "/grpc.health.v1.Health/Watch"})
HEALTH_SERVICE = "/grpc.health.v1.Health/"


# The reasons a refusal's ErrorInfo may carry (the contract's ErrorReason names): the `reason`
# label takes these only, and OTHER for anything else, so that its values stay bounded.
KNOWN_REASONS = frozenset(
    value.name.removeprefix("ERROR_REASON_")
    for value in sessions_pb2.ErrorReason.DESCRIPTOR.values
    if value.number != sessions_pb2.ERROR_REASON_UNSPECIFIED
)
OTHER_REASON = "OTHER"
STATUS_DETAILS_KEY = "grpc-status-details-bin"
_ERROR_INFO = error_details_pb2.ErrorInfo.DESCRIPTOR
AUTH_REFUSALS = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})
OBJECT_KEY_HEADER = "x-object-key"
# The access log names an object by the start of its file's name (the SHA-256 of its key): the
# file is found from it, and no key (a tenant's name, perhaps) is written to the log.
LOGGED_DIGEST_CHARS = 16
ACCESS_LOGGER = "sessions.access"  # `--access-log` turns it on; so does --log-level DEBUG
access_log = logging.getLogger(ACCESS_LOGGER)


def reason_of(context: Any) -> str:
    """The ErrorInfo reason of the status the call was answered (`abort` and `end_with` put it in
    the trailing metadata), bounded to KNOWN_REASONS and OTHER; "" when the status carries none."""
    for key, value in context.trailing_metadata() or ():
        if key != STATUS_DETAILS_KEY:
            continue
        try:
            status = status_pb2.Status.FromString(value if isinstance(value, bytes) else value.encode("latin-1"))
        except (DecodeError, UnicodeEncodeError):
            return OTHER_REASON
        for detail in status.details:
            if detail.Is(_ERROR_INFO):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return info.reason if info.reason in KNOWN_REASONS else OTHER_REASON
        return ""
    return ""


def logged_object(request: Any, context: Any) -> str:
    """What the access log names the call's object by: the first LOGGED_DIGEST_CHARS of its
    file's name, from the request's `object_key` or else the `x-object-key` header; "-" when the
    call names none."""
    key = getattr(request, "object_key", None)
    if not isinstance(key, str) or not key:
        header = next((value for name, value in context.invocation_metadata() or () if name == OBJECT_KEY_HEADER), None)
        if header is None:
            return "-"
        key = urllib.parse.unquote(header if isinstance(header, str) else header.decode("latin-1"))
    return keys.file_digest(key)[:LOGGED_DIGEST_CHARS]


class CallMeter:
    """Counts and times every call, keeps the count of calls started and in flight, and sets
    each call's request id for logging; logs each call's end to the access log (when enabled)
    and each refusal by the token check (rate-limited, `RefusalLog`).

    Each method's handler is wrapped once (`metered`), where it is registered, rather than by a
    grpc.aio interceptor: with any interceptor installed, grpc runs a chain of coroutines and the
    interceptor builds a new handler on every call, which cost ≈100 µs of server CPU per call
    here (a health check 505 → 605 µs, the active leaf 1,020 → 1,140 µs).
    """

    def __init__(self, metrics: Metrics, refusals: RefusalLog | None = None) -> None:
        self._metrics = metrics
        self.refusals = refusals if refusals is not None else RefusalLog()
        self.calls_in_flight = 0  # calls but change feeds, while their handler runs
        self.calls_started = 0  # calls but health checks (a probe every few seconds is not work)
        self._idle: asyncio.Event | None = None  # set when no call is in flight (a drain waits for it)
        metrics.calls_in_flight.set_function(lambda: self.calls_in_flight)
        # Labelled series, looked up once each: `labels()` takes a lock and builds a key.
        self._counters: dict[tuple[str, str, str, str], Any] = {}
        self._timers: dict[tuple[str, str], Any] = {}

    async def until_idle(self, seconds: float) -> bool:
        """Waits up to `seconds` for a moment with no call in flight; False if none came."""
        if not self.calls_in_flight:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, seconds))
            return True
        except TimeoutError:
            return False
        finally:
            self._idle = None

    def _finished(self, service: str, method: str, code: str, reason: str, seconds: float) -> None:
        counter = self._counters.get((service, method, code, reason))
        if counter is None:
            counter = self._counters[(service, method, code, reason)] = self._metrics.rpcs.labels(
                service, method, code, reason
            )
        timer = self._timers.get((service, method))
        if timer is None:
            timer = self._timers[(service, method)] = self._metrics.latency.labels(service, method)
        counter.inc()
        timer.observe(seconds)

    def metered(self, full_method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        """`handler` (of `/package.Service/Method`) counted, timed and given a request id."""
        service, _, method = full_method.lstrip("/").rpartition("/")
        named = f"{service.rpartition('.')[2]}/{method}"  # as the logs name it: SessionService/GetMessage
        is_work = not full_method.startswith(HEALTH_SERVICE)
        is_tracked = full_method not in CHANGE_FEEDS and not handler.stream_stream
        finished = self._finished
        refusals = self.refusals

        def begin(context: Any) -> tuple[float, str, float | None]:
            if is_work:
                self.calls_started += 1
            if is_tracked:
                self.calls_in_flight += 1
            incoming = dict(context.invocation_metadata() or ()).get("x-request-id")
            request_id.set(_caller_request_id(incoming) if incoming else _fresh_request_id())
            serving.set(context)
            # The peer while the call is live: once it is cancelled or past its deadline, gRPC
            # no longer says (the access log read it at the end, and printed nothing for them).
            peer = context.peer() if access_log.isEnabledFor(logging.DEBUG) else ""
            return time.perf_counter(), peer, context.time_remaining()

        def end(
            context: Any, request: Any, started: float, peer: str, allowed: float | None, failure: BaseException | None
        ) -> None:
            seconds = time.perf_counter() - started
            if is_tracked:
                self.calls_in_flight -= 1
                if not self.calls_in_flight and self._idle is not None:
                    self._idle.set()
            code = context.code()
            if isinstance(code, grpc.StatusCode):
                name = code.name
            elif failure is None:
                # An answer made well after the deadline never reached the client, which gRPC told
                # DEADLINE_EXCEEDED (though a write may have been carried out: the docs say so).
                # Just after it, gRPC's timer may not have fired yet and the answer still goes.
                late = allowed is not None and seconds > allowed + LATE_ANSWER_SECONDS
                name = "DEADLINE_EXCEEDED" if late else "OK"
            elif isinstance(failure, asyncio.CancelledError):
                # gRPC ends a call whose deadline passed by cancelling its handler, as it does a
                # call its client cancelled: the client saw DEADLINE_EXCEEDED, so do the counts.
                name = "DEADLINE_EXCEEDED" if _deadline_passed_for(context) else "CANCELLED"
            else:
                name = "UNKNOWN"
            reason = "" if name == "OK" else reason_of(context)
            finished(service, method, name, reason, seconds)
            if name in AUTH_REFUSALS:
                refusals.note(context.peer(), named, name, reason, context.details() or "")
            if access_log.isEnabledFor(logging.DEBUG):
                access_log.debug(
                    "%s %s reason=%s %.1f ms object=%s peer=%s",
                    named,
                    name,
                    reason or "-",
                    seconds * 1000,
                    logged_object(request, context),
                    peer,
                )

        inner: Any = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream

        async def awaited(request: Any, context: Any) -> Any:
            started, peer, allowed = begin(context)
            failure: BaseException | None = None
            try:
                return await inner(request, context)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                end(context, request, started, peer, allowed, failure)
                # The failure's traceback holds this frame, which held the failure: a cycle that
                # kept every frame of the call (a cancelled 10 MB upload's text and its prepared
                # forms) until a full collection, which a server tuned for few comes rarely to.
                failure = None

        async def generated(request: Any, context: Any) -> AsyncIterator[Any]:
            started, peer, allowed = begin(context)
            failure: BaseException | None = None
            try:
                async for response in inner(request, context):
                    yield response
            except BaseException as exc:
                failure = exc
                raise
            finally:
                end(context, request, started, peer, allowed, failure)
                failure = None  # as in `awaited`

        # A generator's responses pass through one of ours; any other handler (unary, or a stream
        # written through its context) is awaited, and its responses pass through nothing extra.
        behavior = generated if inspect.isasyncgenfunction(inner) else awaited
        factory = _HANDLER_FACTORIES[(handler.request_streaming, handler.response_streaming)]
        return factory(behavior, handler.request_deserializer, handler.response_serializer)


_HANDLER_FACTORIES: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


GRPC_CORE_LOGGER = "grpc._cython.cygrpc"


class EndedCallFilter(logging.Filter):
    """Keeps at DEBUG what gRPC logs as an ERROR, with a traceback, when a call's status could
    not be sent because the call had already ended: a stream's handler finished just as its
    client cancelled or its deadline passed, or a unary call's answer came after its deadline.
    The status had nowhere to go and nothing went wrong on the server; an operator paged for it
    would learn to ignore ERROR lines. A unary answer refused before its deadline (one past the
    send limit, say) stays an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        failure = record.exc_info[1] if record.exc_info else None
        if failure is None or type(failure).__name__ != "ExecuteBatchError":
            return True
        # gRPC names the operations of the refused batch: the status alone ends a stream whose
        # responses all went; with a response, it is a unary call's answer.
        operations = str(failure)
        if "SendStatusFromServerOperation" not in operations:
            return True
        if "SendMessageOperation" in operations and not _deadline_passed():
            return True
        record.msg, record.args = "%s: the call ended before its status could be sent", (record.getMessage(),)
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_ended_calls() -> None:
    """Installs `EndedCallFilter` on gRPC's server logger, once per process."""
    core = logging.getLogger(GRPC_CORE_LOGGER)
    if not any(isinstance(existing, EndedCallFilter) for existing in core.filters):
        core.addFilter(EndedCallFilter())


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, request id, message (and error)."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        entry = {
            # RFC 3339 in UTC with milliseconds: log pipelines order and join lines by it.
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)
