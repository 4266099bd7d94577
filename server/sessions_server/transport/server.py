"""Server lifecycle: build the gRPC server, bind, serve, drain and stop.

`create_server` is kept apart from `serve` so tests can bind port 0 in-process. Shutdown is
graceful: health flips to NOT_SERVING first, new calls are refused with UNAVAILABLE, calls in
flight get `drain_seconds` to finish, then objects close (queued writes commit first).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2_grpc

from sessions_proto.v1 import sessions_pb2
from sessions_server.config import ServerConfig, split_host_port
from sessions_server.domain import paths
from sessions_server.domain.errors import Unavailable
from sessions_server.domain.keys import LARGEST_KEY_LIMIT_BYTES
from sessions_server.domain.placement import Placement
from sessions_server.domain.service import SessionsService
from sessions_server.integrations.chat_completions import ChatCompletionsSummarizer
from sessions_server.storage.datadir import (
    SCRATCH_DIR_NAME,
    DataDirectoryInUse,
    DataDirectoryLock,
    DataDirectoryNotWritable,
    check_writable,
    clear_scratch,
    make_directories,
)
from sessions_server.storage.paths import OBJECTS_DIR
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.transport import framing, packed_cache
from sessions_server.transport.auth import TokenAuthority
from sessions_server.transport.calls import abort
from sessions_server.transport.certificates import CertificateFiles
from sessions_server.transport.handlers import WrappingRegistrar, generic_handler, refusing_unauthorized
from sessions_server.transport.idle import run_when_idle
from sessions_server.transport.metrics import CallMeter, Metrics, quiet_ended_calls
from sessions_server.transport.open_services import (
    MAX_REFLECTION_STREAMS,
    Bounded,
    EndableStreams,
    HealthServicer,
    needing_token,
    probe_server,
)
from sessions_server.transport.reflection import SERVICE_NAME as REFLECTION_SERVICE
from sessions_server.transport.reflection import ReflectionServicer
from sessions_server.transport.servicer import Draining, SessionServicer

log = logging.getLogger("sessions.server")
SERVICE_NAME = sessions_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name
# Headers beside the object key: a bearer token, tracing, the user agent, a proxy's own.
HEADER_ROOM_BYTES = 32 * 1024


class HealthWatches:
    """The main port's health `Watch` streams, which a drain ends.

    A watch lasts for as long as its caller likes (a balancer's, a client's health checking),
    so gRPC's stop waited out the whole drain for them: the port closed at once (new callers
    refused a connection instead of told DRAINING) and the process lingered `--drain-seconds`
    with nothing else left to do. Each watch runs as a task of its own; once the drain has
    nothing else to wait for (`end`), a watch that has told its caller the status that holds
    to the end (anything but SERVING: NOT_SERVING, or SERVICE_UNKNOWN for a name never served)
    ends with UNAVAILABLE, reason DRAINING, as a change feed does; one that has not, as soon as
    it has. The probe port's watches end with that server, which waits for no call."""

    def __init__(self) -> None:
        self._open: set[_Watch] = set()
        self.ending = False
        self._none_open: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._open)

    def wrap(self, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        """The Watch handler (a unary-stream one that writes its responses itself), endable."""
        inner: Any = handler.unary_stream

        async def watch(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            state = _Watch(context, self)
            task = asyncio.ensure_future(inner(request, state))
            released = asyncio.ensure_future(state.released.wait())
            self._open.add(state)
            try:
                await asyncio.wait((task, released), return_when=asyncio.FIRST_COMPLETED)
            finally:
                released.cancel()
                if not task.done():
                    task.cancel()  # its own cleanup (the library's count of watchers) runs as it ends
                self._open.discard(state)
                if not self._open and self._none_open is not None:
                    self._none_open.set()
            if task.done():
                task.result()  # its own end: an abort (too many watches), or an error
                return
            await abort(context, Unavailable("the server is shutting down; retry on a new connection"))

        return grpc.unary_stream_rpc_method_handler(watch, handler.request_deserializer, handler.response_serializer)

    async def end(self, seconds: float) -> None:
        """Ends every watch, each once it has told its caller it is not serving, and those
        that open from now on after their first answer; waits up to `seconds` for them."""
        self.ending = True
        for state in self._open:
            state.release_when_told()
        if not self._open:
            return
        self._none_open = asyncio.Event()
        try:
            await asyncio.wait_for(self._none_open.wait(), max(0.0, seconds))
        except TimeoutError:
            log.info("%d health watch(es) had not been told NOT_SERVING when the drain ended", len(self._open))
        finally:
            self._none_open = None


class _Watch:
    """A watch's context for its handler: the call's own, noting the last status written."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any], watches: HealthWatches) -> None:
        self._context = context
        self._watches = watches
        self.released = asyncio.Event()
        self.last_status: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, response: health_pb2.HealthCheckResponse) -> None:
        await self._context.write(response)
        self.last_status = response.status
        if self._watches.ending:
            self.release_when_told()

    def release_when_told(self) -> None:
        if self.last_status is not None and self.last_status != health_pb2.HealthCheckResponse.SERVING:
            self.released.set()


@dataclass
class RunningServer:
    """A started server and what it owns."""

    server: grpc.aio.Server
    port: int
    address: str
    registry: ObjectRegistry
    executor: ThreadPoolExecutor
    health: Any
    draining: Draining
    drain_seconds: float
    service: SessionsService
    authority: TokenAuthority | None
    calls: CallMeter
    metrics: Metrics
    data_dir_lock: DataDirectoryLock
    commit_executor: ThreadPoolExecutor
    probes: grpc.aio.Server | None = None  # --probe-listen: health alone
    probe_address: str | None = None
    watches: HealthWatches = field(default_factory=HealthWatches)
    streams: EndableStreams = field(default_factory=EndableStreams)
    # Set (`hurry`) to cut a drain short: calls in flight are cancelled, nothing more is waited for.
    hurried: asyncio.Event = field(default_factory=asyncio.Event)

    def reload_tokens(self) -> None:
        """Re-reads the tokens file (SIGHUP), on the event loop's thread. Open change feeds
        check their grant again at once: one of a revoked token ends now, not at its next event
        or progress tick (up to --progress-seconds later). Without a tokens file there is
        nothing to re-read: the signal is logged, and the server goes on."""
        if self.authority is None:
            log.info("SIGHUP: no --tokens-file to re-read; nothing reloaded")
            return
        before = self.authority.generation
        self.authority.reload()
        if self.authority.generation != before:
            self.registry.interrupt_feeds()

    def hurry(self) -> None:
        """Cuts the drain short (a second SIGTERM/SIGINT): calls in flight are cancelled, and
        the stop goes on at once to close the objects (their committed writes are durable) and
        release the data directory. Before `stop`, it makes the drain a stop without grace."""
        self.hurried.set()

    async def stop(self) -> None:
        """Graceful stop: NOT_SERVING, refuse new calls, let in-flight calls finish, close.

        The port stays open while the calls in flight finish (up to `drain_seconds`), so that a
        caller arriving meanwhile is told why it is refused (UNAVAILABLE with reason DRAINING,
        which the clients retry whatever the method) and a health check sees NOT_SERVING, where
        a closed port would only refuse their connections. Health watches, told NOT_SERVING at
        the start, end once nothing else is left to wait for (they would hold the stop for the
        whole drain). `hurry` skips whatever is left of the waits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_seconds

        def remaining() -> float:
            return 0.0 if self.hurried.is_set() else max(0.0, deadline - loop.time())

        try:
            self.draining.active = True
            await self.health.enter_graceful_shutdown()
            self.registry.close_feeds()  # subscribers end with UNAVAILABLE: reconnect elsewhere
            await self._unless_hurried(self.calls.until_idle(remaining()))
            if self.calls.calls_in_flight:  # an operator learns what the stop cut, and why
                log.warning(
                    "drain: %d calls still in flight after %.1f s (%s); gRPC cancels them as it stops",
                    self.calls.calls_in_flight,
                    self.drain_seconds - (deadline - loop.time()),
                    "stopped early by a second signal" if self.hurried.is_set() else "--drain-seconds ran out",
                )
            await self._unless_hurried(self.watches.end(remaining()))
            self.streams.end()  # nothing else left: gRPC's stop would wait out the drain for them
            await self._stop_server(remaining())
            if self.probes is not None:  # told NOT_SERVING all along the drain, as the main port
                await self.probes.stop(0)
            await self._unless_hurried(self.service.compactor.wait_idle(remaining()))
            self.service.compactor.held_plans.close()
            await self.registry.close_all()
            self.executor.shutdown(wait=True)
            self.commit_executor.shutdown(wait=True)
        finally:
            await asyncio.to_thread(self.metrics.close)  # its shutdown polls for up to 0.5 s
        self.data_dir_lock.release()  # last: nothing of this server touches the files any more

    async def _until_done_or_hurried(self, task: asyncio.Future[Any]) -> None:
        """Returns once `task` is done or the drain is hurried, whichever comes first."""
        hurried = asyncio.ensure_future(self.hurried.wait())
        try:
            await asyncio.wait((task, hurried), return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurried.cancel()

    async def _unless_hurried(self, waiting: Coroutine[Any, Any, Any]) -> None:
        """Awaits `waiting`, or stops waiting (cancels it) once the drain is hurried."""
        task = asyncio.ensure_future(waiting)
        try:
            await self._until_done_or_hurried(task)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _stop_server(self, grace: float) -> None:
        """gRPC's stop with `grace` for the calls still in flight; cancels them at once when
        hurried meanwhile (a second stop of the server, which gRPC allows)."""
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await self._until_done_or_hurried(stopping)
        if not stopping.done():
            await self.server.stop(None)  # cancels every call now
        await stopping


async def create_server(config: ServerConfig) -> RunningServer:
    """Builds and starts a server bound to `config.listen` (port 0 picks a free port). Raises
    DataDirectoryInUse (an OSError) when another server holds `config.data_dir`, OSError naming
    the flag at fault for what the machine refuses.

    What can be checked without the data directory (the tokens and ring files, the TLS files,
    plaintext on a non-loopback address) is checked, and the ports are bound, before it is
    touched: a start refused for one of those leaves no trace there. One refused after taking
    it (a directory that cannot be written) removes what it made (`DataDirectoryLock.abandon`)."""
    authority = TokenAuthority(config.tokens_file) if config.tokens_file else None
    placement = Placement.from_ring_file(config.ring_file) if config.ring_file else None
    metrics = Metrics()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", framing.RESPONSE_LIMIT_BYTES),
            ("grpc.so_reuseport", 0),
            *_PENDING_CALL_OPTIONS,
            *_COMPRESSION_OPTIONS,
            *_keepalive_options(config),
            *_connection_options(config),
            *_metadata_options(),
            *config.extra_options,
        ],
    )
    health_servicer = HealthServicer()
    probes = (
        probe_server(health_servicer, [*_keepalive_options(config), *_COMPRESSION_OPTIONS])
        if config.probe_listen
        else None
    )
    probe_address = None
    lock: DataDirectoryLock | None = None
    try:
        port = _bind(server, config)
        if probes is not None and (probe_listen := config.probe_listen):
            probe_port = _add_port(lambda: probes.add_insecure_port(probe_listen), probe_listen, flag="--probe-listen")
            probe_address = f"{probe_listen.rsplit(':', 1)[0]}:{probe_port}"
        if config.metrics_listen:
            _serve_metrics(metrics, config.metrics_listen)
        lock = _take_data_directory(config)
        return await _create_server(
            config, lock, server, port, metrics, authority, placement, health_servicer, probes, probe_address
        )
    except BaseException:
        for bound in (server, probes):  # gives the ports back, to a caller that tries again in-process
            if bound is not None:
                with contextlib.suppress(Exception):
                    await bound.start()  # a server never started keeps its ports through stop()
                await bound.stop(None)
        metrics.close()  # bound last above: its port is given back too
        if lock is not None:
            lock.abandon()
        raise


def _take_data_directory(config: ServerConfig) -> DataDirectoryLock:
    """Takes the data directory's lock, makes its directories and checks they can be written;
    raises OSError naming --data-dir. Abandons the lock (removing what it made) when refused."""
    try:
        lock = DataDirectoryLock.acquire(config.data_dir, "sessions-server serve")
    except DataDirectoryInUse as exc:
        raise DataDirectoryInUse(
            f"{exc}: one server owns a data directory at a time; stop that one first, or give this one "
            "its own --data-dir"
        ) from None
    except DataDirectoryNotWritable as exc:
        raise DataDirectoryNotWritable(f"--data-dir {config.data_dir}: {exc}") from None
    try:
        # Made now, not with the first object: a replicator watching it (Litestream) fails to
        # start on a directory that does not exist yet. Scratch too, so that both are checked:
        # a server that cannot create files in them would fail every write, one call at a time.
        for directory in (config.data_dir / OBJECTS_DIR, config.data_dir / SCRATCH_DIR_NAME):
            try:
                lock.note_created(make_directories(directory))
                check_writable(directory)
            except OSError as exc:
                reason = exc if isinstance(exc, DataDirectoryNotWritable) else f"cannot create {directory} ({exc})"
                raise DataDirectoryNotWritable(
                    f"--data-dir {config.data_dir}: {reason}; the server must be able to create files there "
                    "(check the owner and mode of the directory, and that its file system is not read-only)"
                ) from None
        files, size = clear_scratch(config.data_dir)
        if files:
            log.info("removed %d file(s), %d bytes, left in scratch by work a stop cut short", files, size)
    except BaseException:
        lock.abandon()
        raise
    return lock


async def _create_server(
    config: ServerConfig,
    lock: DataDirectoryLock,
    server: grpc.aio.Server,
    port: int,
    metrics: Metrics,
    authority: TokenAuthority | None,
    placement: Placement | None,
    health_servicer: HealthServicer,
    probes: grpc.aio.Server | None,
    probe_address: str | None,
) -> RunningServer:
    executor = ThreadPoolExecutor(max_workers=config.worker_threads, thread_name_prefix="sessions-sql")
    commit_executor = ThreadPoolExecutor(max_workers=config.worker_threads, thread_name_prefix="sessions-commit")
    calls = CallMeter(metrics)
    registry = ObjectRegistry(
        config.data_dir,
        executor,
        max_open=config.max_open_objects,
        feed=config.feed,
        calls_in_flight=lambda: calls.calls_in_flight,
        commit_executor=commit_executor,
        discard_unwritten=True,  # an object exists once written: a refused first write leaves none
    )
    summarizer = (
        ChatCompletionsSummarizer(
            config.summarizer_url,
            config.summarizer_model,
            config.summarizer_api_key_env,
            config.summarizer_timeout_seconds,
        )
        if config.summarizer_url
        else None
    )
    service = SessionsService(
        registry,
        reserved_metadata_keys=config.reserved_metadata_keys,
        max_object_key_bytes=config.max_object_key_bytes,
        summarizer=summarizer,
        max_query_bytes=config.max_query_bytes,
        search_seconds=config.search_seconds,
        max_concurrent_searches=config.max_concurrent_searches,
        limits=config.limits,
        placement=placement,
    )
    for key, where in service.objects.set_moved_leftovers_aside():
        log.warning(
            "object %r is recorded as moved away (or deleted) but its file was still here: set aside as %s "
            "(delete it, or bring it back with `sessions-server import-store %s --object-key KEY`)",
            key,
            where,
            where,
        )
    draining = Draining()
    metrics.open_objects.set_function(lambda: registry.open_count)
    metrics.row_writes.set_function(registry.row_writes)
    metrics.row_writes_total.set_function(registry.rows_written)
    metrics.bytes_stored.set_function(registry.open_bytes)
    metrics.free_bytes.set_function(registry.free_bytes)
    metrics.subscribers.set_function(registry.subscriber_count)
    metrics.feed_retained_bytes.set_function(registry.feed_retained_bytes)
    metrics.searches_running.set_function(lambda: service.search_slots.running)
    metrics.searches_waiting.set_function(lambda: service.search_slots.waiting)
    metrics.held_plans.set_function(lambda: len(service.compactor.held_plans))
    metrics.memo_bytes.labels("paths").set_function(lambda: paths.remembered_bytes()[0])
    metrics.memo_bytes.labels("messages").set_function(lambda: paths.remembered_bytes()[1])
    metrics.memo_bytes.labels("responses").set_function(packed_cache.kept_bytes)
    service.compactor.on_stored = lambda kind: metrics.compactions.labels(kind).inc()
    quiet_ended_calls()
    reflection_guard = authority if config.auth_protect_reflection else None
    # Unauthenticated health moves to the probe port, where requests are small.
    health_guard = authority if config.probe_listen else None
    reflections = Bounded(MAX_REFLECTION_STREAMS, "reflection streams")
    watches = HealthWatches()
    streams = EndableStreams()

    def wrap(method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        if method.startswith(f"/{REFLECTION_SERVICE}/"):
            if reflection_guard is not None:
                handler = needing_token(reflection_guard, handler)
            handler = streams.stream_stream(reflections.stream_stream(handler))
        elif method.startswith(f"/{health.SERVICE_NAME}/"):
            if method == f"/{health.SERVICE_NAME}/Watch":
                handler = watches.wrap(handler)
            if health_guard is not None:
                handler = needing_token(health_guard, handler)
        return calls.metered(method, handler)

    registrar = WrappingRegistrar(server, wrap)
    servicer = SessionServicer(
        service,
        draining,
        progress_seconds=config.progress_seconds,
        authority=authority,
        require_routing_header=config.require_routing_header or config.ring_file is not None,
    )
    metrics.assembly_bytes.set_function(lambda: servicer.assembly.held_bytes)
    metrics.small_write_bytes.set_function(lambda: servicer.assembly.small_held_bytes)
    screen = refusing_unauthorized(authority) if authority is not None else None
    registrar.add_generic_rpc_handlers((generic_handler(servicer),), screen)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registrar)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        ReflectionServicer((SERVICE_NAME, health.SERVICE_NAME, REFLECTION_SERVICE)), registrar
    )
    for name in ("", SERVICE_NAME):  # before the first call can come: a Watch then knows the names
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    await server.start()
    if probes is not None:
        await probes.start()
    host = config.listen.rsplit(":", 1)[0]
    return RunningServer(
        server,
        port,
        f"{host}:{port}",
        registry,
        executor,
        health_servicer,
        draining,
        config.drain_seconds,
        service,
        authority,
        calls,
        metrics,
        lock,
        commit_executor,
        probes,
        probe_address,
        watches,
        streams,
    )


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(server: grpc.aio.Server, config: ServerConfig) -> int:
    """Binds with TLS (mTLS when a client CA is given); plaintext only on loopback unless allowed.
    Returns the port bound; raises OSError naming the flag at fault."""
    host = config.listen.rsplit(":", 1)[0]
    if config.tls_cert or config.tls_key:
        if not (config.tls_cert and config.tls_key):
            raise OSError("--tls-cert and --tls-key go together")
        credentials = CertificateFiles(config.tls_cert, config.tls_key, config.tls_client_ca).credentials()
        # gRPC checks the certificate and key here too, and fails as it does for the address.
        unusable = ", or --tls-cert/--tls-key are no certificate chain and matching private key in PEM"
        return _add_port(lambda: server.add_secure_port(config.listen, credentials), config.listen, unusable)
    if config.tls_client_ca:
        raise OSError("--tls-client-ca needs --tls-cert and --tls-key")
    if not _is_loopback(host) and not config.allow_plaintext:
        raise OSError(
            f"refusing plaintext on non-loopback address {host}: give --tls-cert/--tls-key, "
            "or --allow-plaintext behind a trusted network"
        )
    return _add_port(lambda: server.add_insecure_port(config.listen), config.listen)


def _add_port(add: Callable[[], int], listen: str, or_else: str = "", flag: str = "--listen") -> int:
    refused = _bind_refusal(listen)
    if refused is not None:
        raise OSError(f"could not listen on {listen} ({flag}): {refused}")
    # gRPC raises RuntimeError("Failed to bind ...; set GRPC_VERBOSITY=debug ...") naming no
    # cause (a port in use, an address not of this host, a name that does not resolve: its own
    # log line says which), and older releases returned 0 instead.
    try:
        port = add()
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"could not listen on {listen} ({flag}): address in use or not available{or_else}")
    return port


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})


def _bind_refusal(listen: str) -> str | None:
    """Why the system would refuse to bind `listen` (its reason, as "Address already in use"),
    tried with sockets of our own before gRPC binds; None when an address of it binds. gRPC
    core logs its own refusal first, an ERROR line (shown at GRPC_VERBOSITY=ERROR, the level
    the command sets) above the server's, and tells the server no cause. Port 0 always binds."""
    host, port = split_host_port(listen)
    if port == 0 or host.strip("[]") in WILDCARD_HOSTS:
        # gRPC binds a wildcard its own way (`::` dual-stack, else 0.0.0.0): a trial of one
        # address could refuse what it accepts (`[::]` on a host without IPv6).
        return None
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{host} does not resolve ({exc.strerror})"
    reasons = []
    for family, kind, protocol, _, address in found:
        try:
            with socket.socket(family, kind, protocol) as trial:
                trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
                trial.bind(address)
        except OSError as exc:
            reasons.append(exc.strerror or str(exc))
            continue
        return None  # gRPC binds every address it can, and fails only when none binds
    return reasons[0] if reasons else None


def _serve_metrics(metrics: Metrics, listen: str) -> None:
    host, port = split_host_port(listen)
    try:
        # The endpoint's own parsing splits at the last colon and wants an IPv6 host bare.
        metrics.serve(f"{host.strip('[]')}:{port}")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OSError(f"could not listen on {listen} (--metrics-listen): {reason}") from None


# gRPC core queues calls that arrive faster than the event loop takes them, and past 1,000
# queued it begins to drop them at random (3,000: all), answered CANCELLED, which no client can
# tell from its own cancellation nor retry: a burst of 3,000 concurrent reads lost 475 of them
# (measured). Calls wait in the queue instead, up to these bounds; past them, or after 30 s in
# it, the shedding is the overload protection it was.
_PENDING_CALL_OPTIONS = (
    ("grpc.server.max_pending_requests", 16_384),
    ("grpc.server.max_pending_requests_hard_limit", 32_768),
)


# Requests are taken uncompressed only: gRPC core inflates a compressed request up to
# --max-request-bytes before any handler (or the assembly budget) sees it, on the threads every
# call shares, so 61 KB of gzip became 60 MiB each, 40 of them held 2.5 GiB and stalled other
# connections' calls for 30 s, and each one inflating past the bound still cost about 0.5 s
# (measured). A compressed request is refused at once, UNIMPLEMENTED ("Compression algorithm
# 'gzip' is disabled"); the clients never compress, and responses are not compressed either.
_COMPRESSION_OPTIONS = (("grpc.compression_enabled_algorithms_bitset", 1),)  # identity alone


def _metadata_options() -> list[tuple[str, int]]:
    """Room for a call's headers. Clients send the object key in `x-object-key` too,
    percent-encoded: up to three times its bytes. gRPC core's defaults (8 KiB, beyond which it
    refuses some calls at random, and 16 KiB) turned a key the server takes into a
    RESOURCE_EXHAUSTED that no handler saw, and a key too long into that instead of
    INVALID_OBJECT_KEY; the same bound for both, so that nothing is refused at random. Room for
    any key up to the largest limit a server may be given, not this server's: sized by its own
    limit (36 KiB at 1 KiB), a longer key, 4,200 CJK characters say, was refused by each client
    in its own words (RESOURCE_EXHAUSTED, INTERNAL, and TypeScript's REFUSED_STREAM, tried
    again as an outage) instead of INVALID_OBJECT_KEY. The room does not bound what a hostile
    client's many small headers hold anyway (docs/operations.md)."""
    room = 4 * LARGEST_KEY_LIMIT_BYTES + HEADER_ROOM_BYTES
    return [("grpc.max_metadata_size", room), ("grpc.absolute_max_metadata_size", room)]


def _connection_options(config: ServerConfig) -> list[tuple[str, int]]:
    """What one client connection may hold: streams at once, how long it stays without a call,
    and how long it stays at all (gRPC spreads that by a tenth either way, so that connections
    made together do not all go at once)."""
    options = [("grpc.max_concurrent_streams", config.max_streams_per_connection)]
    if config.max_connection_idle_seconds:
        options.append(("grpc.max_connection_idle_ms", round(config.max_connection_idle_seconds * 1000)))
    if config.max_connection_age_seconds:
        options.append(("grpc.max_connection_age_ms", round(config.max_connection_age_seconds * 1000)))
        options.append(("grpc.max_connection_age_grace_ms", round(config.max_connection_age_grace_seconds * 1000)))
    return options


def _keepalive_options(config: ServerConfig) -> list[tuple[str, int]]:
    """gRPC core's options for the keepalive policy in `ServerConfig`."""
    timeout_ms = round(config.keepalive_timeout_seconds * 1000)
    return [
        ("grpc.keepalive_time_ms", round(config.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        # grpc 1.85 waits for a keepalive ping's answer as for any ping (60 s by default): with
        # keepalive_timeout_ms alone, a connection to a vanished client stayed open (measured).
        ("grpc.http2.ping_timeout_ms", timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        # The server-side spelling of GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS; a
        # "min_recv" spelling is silently ignored.
        ("grpc.http2.min_ping_interval_without_data_ms", round(config.min_client_ping_seconds * 1000)),
    ]


async def serve(
    config: ServerConfig,
    stop: asyncio.Event,
    on_idle: Callable[[], bool] | None = None,
    hurry: asyncio.Event | None = None,
) -> None:
    """Runs until `stop` is set, then stops gracefully; `hurry`, set during that stop, cuts its
    drain short (`RunningServer.hurry`). `on_idle` runs off the event loop each time the server
    goes idle (`config.idle_seconds` without a call); it returns whether it released memory
    (counted in the metrics)."""
    running = await create_server(config)
    loop = asyncio.get_running_loop()
    kind = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    ports = f", probes: {running.probe_address}" if running.probe_address else ""
    ports += f", metrics: {config.metrics_listen}" if config.metrics_listen else ""
    # On standard output, in plain text whatever --log-format says (tools and tests read the
    # address from it); the logs go to standard error.
    print(f"sessions-server listening on {running.address} (data: {config.data_dir}, loop: {kind}{ports})", flush=True)
    log.info("listening on %s%s", running.address, ports)
    # Always handled: SIGHUP's default action ends the process at once, no drain (a terminal
    # closed, a `systemctl reload`, a log rotation's `kill -HUP`).
    loop.add_signal_handler(signal.SIGHUP, running.reload_tokens)
    watcher = None
    if on_idle is not None and config.idle_seconds > 0:

        def release() -> bool:
            released = on_idle()
            if released:
                running.metrics.heap_releases.inc()
            return released

        watcher = asyncio.create_task(run_when_idle(running.calls, config.idle_seconds, release, running.executor))
    await stop.wait()
    if watcher is not None:
        watcher.cancel()
    log.info(
        "draining: %d calls in flight, waiting up to %.0f s for them",
        running.calls.calls_in_flight,
        config.drain_seconds,
    )
    hurrying = None
    if hurry is not None:

        async def hurried() -> None:
            await hurry.wait()
            running.hurry()

        hurrying = asyncio.create_task(hurried())
    try:
        await running.stop()
    finally:
        if hurrying is not None:
            hurrying.cancel()
    print("sessions-server stopped", flush=True)
