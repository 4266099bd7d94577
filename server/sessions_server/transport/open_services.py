"""The services a caller may reach without a token: health and server reflection. Here are
their bounds, the token guard each takes when the server asks for one, and the probe port.

gRPC sets the largest request per server, not per service, and receives a unary request whole
before any handler runs. On the main port a health request may therefore be as large as
`--max-request-bytes`: a caller without a token sent 60 MB Health/Check requests but their
last byte, and the server held each one until the connection closed (8 calls, RSS 50 → 514
MiB). A health request is a service name; `--probe-listen` serves health alone on a port of its
own, where a request past `PROBE_REQUEST_BYTES` is refused as its length arrives, and then, with
tokens, health on the main port needs a token, checked before its request is read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeAlias

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sessions_server.domain.errors import SessionsError, Unavailable
from sessions_server.transport.auth import TokenAuthority
from sessions_server.transport.calls import abort
from sessions_server.transport.handlers import WrappingRegistrar

# Health watches at once: a probe or a balancer watches, a few each. Health needs no token, and
# each watch holds a stream and some memory (about 22 KB): uncounted, one client opened 20,000.
MAX_HEALTH_WATCHES = 256
# Reflection streams at once (grpcurl, a debugging person's tools): open to any caller unless
# reflection is guarded, and uncounted they held memory as health watches did.
MAX_REFLECTION_STREAMS = 64
# The largest request the probe port takes. A health request is a service name, ours at most 27
# bytes; room is left for names other servers use.
PROBE_REQUEST_BYTES = 4096
# What else a caller of the probe port, who needs no token, may make the server hold:
# - calls at once on one connection (kubelet's probe makes one at a time);
# - watches at once on the probe port, of the MAX_HEALTH_WATCHES the two ports share (token
#   holders on the main port keep the rest);
# - how long a connection lasts, so that one cannot hold its calls (a request never finished,
#   or never sent) for good; then gRPC tells the client to reconnect.
PROBE_STREAMS_PER_CONNECTION = 8
MAX_PROBE_WATCHES = 16
PROBE_CONNECTION_SECONDS = 30
PROBE_CONNECTION_GRACE_SECONDS = 5
# `bdp_probe` off keeps a stream's window at 64 KiB: gRPC otherwise grows it, to 4 MiB and then 8
# MiB as bandwidth allows, and bytes sent on a watch after its request are held unread (256
# watches held 2 GiB). Probes send a few bytes.
_PROBE_OPTIONS = (
    ("grpc.max_receive_message_length", PROBE_REQUEST_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.max_concurrent_streams", PROBE_STREAMS_PER_CONNECTION),
    ("grpc.max_connection_age_ms", PROBE_CONNECTION_SECONDS * 1000),
    ("grpc.max_connection_age_grace_ms", PROBE_CONNECTION_GRACE_SECONDS * 1000),
)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class Bounded:
    """At most `limit` calls at once; more are refused (RESOURCE_EXHAUSTED)."""

    def __init__(self, limit: int, what: str, advice: str = "retry later") -> None:
        self._limit = limit
        self._what = what
        self._advice = advice
        self._active = 0

    @contextlib.asynccontextmanager
    async def held(self, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
        """One of the calls, for as long as the block runs; aborts the call past the limit."""
        if self._active >= self._limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many {self._what} on this server (at most {self._limit}); {self._advice}",
            )
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1

    def unary_stream(self, handler: Handler) -> Handler:
        """For a handler that writes its responses itself (`context.write`), as health's Watch."""
        inner: Any = handler.unary_stream

        async def bounded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            async with self.held(context):
                await inner(request, context)

        return grpc.unary_stream_rpc_method_handler(bounded, handler.request_deserializer, handler.response_serializer)

    def stream_stream(self, handler: Handler) -> Handler:
        inner: Any = handler.stream_stream

        async def bounded(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            async with self.held(context):
                async for response in inner(requests, context):
                    yield response

        return grpc.stream_stream_rpc_method_handler(bounded, handler.request_deserializer, handler.response_serializer)


class EndableStreams:
    """Bidirectional streams (reflection's) that a drain ends: a caller's tool (grpcurl's
    shell, a GUI) may hold one open between its requests for as long as it runs, and gRPC's
    stop waited out the whole drain for it (10 s by default, with no call in flight). Ended,
    a stream is answered UNAVAILABLE, reason DRAINING, as the other calls of a drain.

    The end is a signal the stream's handler waits on beside its next response, not a cancel
    of the call's task: a cancel that came while gRPC was sending a response landed in gRPC's
    own code, which dropped the call without a status, and the caller waited out the drain.
    A response being sent is sent first: a caller that takes none is ended by gRPC's stop."""

    def __init__(self) -> None:
        self._ending = asyncio.Event()

    def stream_stream(self, handler: Handler) -> Handler:
        inner: Any = handler.stream_stream

        async def endable(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            responses = aiter(inner(requests, context))
            ending = asyncio.ensure_future(self._ending.wait())
            following: asyncio.Future[Any] | None = None
            try:
                while True:
                    following = asyncio.ensure_future(anext(responses))
                    await asyncio.wait({following, ending}, return_when=asyncio.FIRST_COMPLETED)
                    if not following.done():
                        await _cancelled(following)
                        await abort(context, Unavailable("the server is shutting down; retry on a new connection"))
                    try:
                        response = following.result()
                    except StopAsyncIteration:
                        return
                    yield response
            finally:
                ending.cancel()
                if following is not None:  # the caller went first: its outcome is nobody's
                    following.cancel()
                    following.add_done_callback(_outcome_taken)

        return grpc.stream_stream_rpc_method_handler(endable, handler.request_deserializer, handler.response_serializer)

    def end(self) -> None:
        """Ends every stream open now, and any opened from now on."""
        self._ending.set()


def _outcome_taken(step: asyncio.Future[Any]) -> None:
    """Takes a step's outcome that no one awaits (the stream's end, its error): asyncio logs an
    exception never retrieved at ERROR, with its traceback, for each cancelled stream."""
    if not step.cancelled():
        step.exception()


async def _cancelled(step: asyncio.Future[Any]) -> None:
    """Cancels a stream's step and waits for it to end: the handler's reads stop before the call
    is answered."""
    step.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, grpc.RpcError):
        await step


class HealthServicer(health.aio.HealthServicer):  # type: ignore[misc,name-defined]
    """grpcio-health-checking's servicer with `List`, which the contract has (and reflection
    shows) but the library's asyncio servicer leaves unimplemented, and with a bounded `Watch`.
    One instance serves both ports, so that they always tell the same."""

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, Any] = {}
        self._shutting_down = False
        self._watches = Bounded(MAX_HEALTH_WATCHES, "health watches", "use Check, or retry later")

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        async with self._watches.held(context):
            if request.service in self._statuses:
                await super().Watch(request, context)
                return
            # A name this server never serves: answered as the library does (SERVICE_UNKNOWN, the
            # call kept open), without the entry the library keeps for good for every name asked.
            await context.write(health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN))
            await asyncio.Event().wait()  # until the caller ends the call, or the server stops

    async def set(self, service: str, status: Any) -> None:
        if not self._shutting_down:  # as the library: a shutdown's NOT_SERVING is for good
            self._statuses[service] = status
        await super().set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        self._shutting_down = True
        self._statuses = dict.fromkeys(self._statuses, health_pb2.HealthCheckResponse.NOT_SERVING)
        await super().enter_graceful_shutdown()

    async def List(self, request: health_pb2.HealthListRequest, context: Any) -> health_pb2.HealthListResponse:
        statuses = {name: health_pb2.HealthCheckResponse(status=status) for name, status in self._statuses.items()}
        return health_pb2.HealthListResponse(statuses=statuses)


def needing_token(authority: TokenAuthority, handler: Handler) -> Handler:
    """`handler` for callers with a known bearer token only, checked before the request is read.

    A handler that takes one request is served as one that takes a stream of them (the same on
    the wire): gRPC reads nothing of a stream until the handler asks, where it receives a unary
    request whole before the handler runs."""
    if handler.stream_stream is not None:
        inner_stream: Any = handler.stream_stream

        async def streams(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            await _authenticate(authority, context)
            async for response in inner_stream(_rechecked(authority, requests, context), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(streams, handler.request_deserializer, handler.response_serializer)
    if handler.unary_unary is not None:
        inner_unary: Any = handler.unary_unary

        async def answers(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await _authenticate(authority, context)
            return await inner_unary(await _the_request(requests, context), context)

        return grpc.stream_unary_rpc_method_handler(answers, handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream is not None:
        inner_watch: Any = handler.unary_stream

        async def writes(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await _authenticate(authority, context)
            revocation = _Revocation(authority, context)
            try:
                # A handler that writes its own responses (context.write), as health's Watch does.
                await inner_watch(await _the_request(requests, context), context)
            except asyncio.CancelledError:
                await revocation.end_if_revoked(context)
                raise
            finally:
                revocation.close()

        return grpc.stream_stream_rpc_method_handler(writes, handler.request_deserializer, handler.response_serializer)
    raise TypeError("a handler taking a stream of requests reads nothing before it runs: guard it where it reads")


async def _rechecked(
    authority: TokenAuthority, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[Any]:
    """A stream's requests, each taken only while its token holds after a reload (as an
    import's frames are): a reflection stream of a revoked token answers nothing more."""
    generation = authority.generation
    async for request in requests:
        if authority.generation != generation:
            await _authenticate(authority, context)
            generation = authority.generation
        yield request


class _Revocation:
    """Ends a stream its handler writes itself (its task) when a reload takes its token away:
    an idle health Watch has no next message at which to find out, and held one of the bounded
    watches. (The handler of a stream of responses runs a task a step, which this cannot end.)"""

    def __init__(self, authority: TokenAuthority, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._authority = authority
        self._metadata = tuple(context.invocation_metadata() or ())
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self.reason: str | None = None
        self.close = authority.on_reload(self._check)

    def _check(self) -> None:  # on the thread that reloaded (the event loop's, for SIGHUP)
        try:
            self._authority.authenticate(self._metadata)
        except SessionsError as exc:
            if self.reason is None and self._task is not None:
                self.reason = exc.message
                self._loop.call_soon_threadsafe(self._task.cancel)

    async def end_if_revoked(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """In the handler cancelled: UNAUTHENTICATED, if the reload is why."""
        if self.reason is not None and self._task is not None:
            self._task.uncancel()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, self.reason)


async def _authenticate(authority: TokenAuthority, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    try:
        authority.authenticate(context.invocation_metadata() or ())
    except SessionsError as exc:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)


async def _the_request(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    async for request in requests:
        return request
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request")


def probe_server(health_servicer: HealthServicer, options: Sequence[tuple[str, int]] = ()) -> grpc.aio.Server:
    """A server, not yet bound, for health alone, with the bounds above and `options` (the
    main port's keepalive, say). It is bound in plaintext: kubelet's gRPC probes speak no TLS,
    and a health status is no secret. Its calls are not metered: probes every few seconds would
    keep the server from ever being idle."""
    server = grpc.aio.server(options=[*_PROBE_OPTIONS, *options])
    watches = Bounded(MAX_PROBE_WATCHES, "health watches on the probe port", "use Check, or retry later")

    def wrap(method: str, handler: Handler) -> Handler:
        return watches.unary_stream(handler) if method.endswith("/Watch") else handler

    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, WrappingRegistrar(server, wrap))
    return server
