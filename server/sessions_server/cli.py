"""The `sessions-server` command."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sessions_server import allocator
from sessions_server.config import (
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_KEEPALIVE_SECONDS,
    DEFAULT_KEEPALIVE_TIMEOUT_SECONDS,
    DEFAULT_LISTEN,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MIN_CLIENT_PING_SECONDS,
    ServerConfig,
)
from sessions_server.domain import paths
from sessions_server.domain.keys import MAX_OBJECT_KEY_BYTES
from sessions_server.domain.limits import Limits
from sessions_server.domain.search import DEFAULT_CONCURRENT_SEARCHES
from sessions_server.storage.feed import FeedSettings
from sessions_server.storage.registry import DEFAULT_MAX_OPEN_OBJECTS
from sessions_server.transport import packed_cache


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessions-server", description="Sessions gRPC server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument(
        "--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to bind; port 0 picks one (default {DEFAULT_LISTEN})"
    )
    serve.add_argument("--data-dir", type=Path, default=Path("./data"), help="where object files live (default ./data)")
    serve.add_argument(
        "--reserved-metadata-key",
        action="append",
        default=[],
        metavar="KEY",
        help="metadata key removed from source=client messages (repeatable)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"largest request accepted, bytes (default {DEFAULT_MAX_REQUEST_BYTES}); larger ones use UploadMessage",
    )
    serve.add_argument(
        "--max-open-objects",
        type=int,
        default=DEFAULT_MAX_OPEN_OBJECTS,
        help=f"objects kept open before idle ones close (default {DEFAULT_MAX_OPEN_OBJECTS})",
    )
    serve.add_argument(
        "--message-memo-bytes",
        type=int,
        default=paths.DEFAULT_MESSAGE_BUDGET_BYTES,
        help="memory for messages remembered from recent reads and appends, all objects together; "
        "a third at most for one session, and a third more for the responses of remembered reads; "
        f"0 turns it off (default {paths.DEFAULT_MESSAGE_BUDGET_BYTES})",
    )
    serve.add_argument(
        "--max-object-key-bytes",
        type=int,
        default=MAX_OBJECT_KEY_BYTES,
        help=f"longest object key accepted, UTF-8 bytes (default {MAX_OBJECT_KEY_BYTES})",
    )
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=DEFAULT_DRAIN_SECONDS,
        help=f"grace period for in-flight calls on shutdown (default {DEFAULT_DRAIN_SECONDS})",
    )
    serve.add_argument(
        "--progress-seconds", type=float, default=10.0, help="idle interval of Subscribe progress events (default 10)"
    )
    serve.add_argument("--search-seconds", type=float, default=2.0, help="time budget of one search (default 2)")
    serve.add_argument(
        "--max-concurrent-searches",
        type=int,
        default=DEFAULT_CONCURRENT_SEARCHES,
        help="searches run at once, server-wide; more wait (up to their time budget, then "
        f"RESOURCE_EXHAUSTED/SERVER_BUSY), leaving SQL threads to other calls (default {DEFAULT_CONCURRENT_SEARCHES})",
    )
    serve.add_argument(
        "--idle-seconds",
        type=float,
        default=ServerConfig.idle_seconds,
        help="seconds without a call after which the server hands freed memory back to the operating "
        f"system, once per quiet spell (glibc, unless the environment tunes malloc); 0 never "
        f"(default {ServerConfig.idle_seconds:g})",
    )
    serve.add_argument(
        "--max-query-bytes", type=int, default=4096, help="longest search query, UTF-8 bytes (default 4096)"
    )
    serve.add_argument("--summarizer-url", help="OpenAI-compatible base URL for server-side compaction")
    serve.add_argument("--summarizer-model", default="gpt-4o-mini", help="model name sent to the summarizer")
    serve.add_argument(
        "--summarizer-api-key-env",
        default="SESSIONS_SUMMARIZER_API_KEY",
        help="environment variable holding the summarizer's API key",
    )
    serve.add_argument("--summarizer-timeout-seconds", type=float, default=60.0, help="summarizer call timeout")
    serve.add_argument("--tls-cert", type=Path, help="PEM certificate chain; enables TLS")
    serve.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    serve.add_argument("--tls-client-ca", type=Path, help="PEM CA bundle; requires client certificates (mTLS)")
    serve.add_argument(
        "--allow-plaintext", action="store_true", help="allow plaintext on a non-loopback address (trusted networks)"
    )
    serve.add_argument(
        "--tokens-file", type=Path, help="JSON file of hashed bearer tokens and their grants (re-read on SIGHUP)"
    )
    serve.add_argument(
        "--auth-protect-reflection", action="store_true", help="require a token for server reflection too"
    )
    limits = Limits()
    serve.add_argument(
        "--max-client-message-bytes",
        type=int,
        default=limits.max_client_message_bytes,
        help=f"largest source=client message, bytes; 0 = no limit (default {limits.max_client_message_bytes})",
    )
    serve.add_argument(
        "--max-object-bytes",
        type=int,
        default=limits.max_object_bytes,
        help=f"object size above which writes are refused, bytes (default {limits.max_object_bytes})",
    )
    serve.add_argument(
        "--max-assembly-bytes",
        type=int,
        default=limits.max_assembly_bytes,
        help=f"bytes of messages held at once while their pieces arrive or while they are written, all calls "
        f"together (default {limits.max_assembly_bytes})",
    )
    serve.add_argument(
        "--max-subscribers-per-object",
        type=int,
        default=limits.max_subscribers_per_object,
        help=f"concurrent Subscribe streams per object (default {limits.max_subscribers_per_object})",
    )
    serve.add_argument(
        "--max-concurrent-streams",
        type=int,
        default=limits.max_concurrent_streams,
        help=f"concurrent streaming calls per server (default {limits.max_concurrent_streams})",
    )
    serve.add_argument(
        "--max-streams-per-token",
        type=int,
        default=limits.max_streams_per_token,
        help="of those, what one bearer token may hold (with --tokens-file); 0 for no bound of its own "
        f"(default {limits.max_streams_per_token})",
    )
    serve.add_argument(
        "--ring-file",
        type=Path,
        help="JSON shard ring; refuse objects this shard does not own (ownership guard), and object calls "
        "without x-object-key metadata",
    )
    serve.add_argument(
        "--require-routing-header",
        action="store_true",
        help="refuse object calls without x-object-key metadata, as a shard behind a proxy that routes by it "
        "(implied by --ring-file)",
    )
    serve.add_argument("--metrics-listen", help="HOST:PORT for a Prometheus /metrics endpoint")
    serve.add_argument("--log-format", choices=("text", "json"), default="text", help="log line format")
    _add_text_limit_flags(serve)
    feed = FeedSettings()
    serve.add_argument(
        "--feed-retain-events",
        type=int,
        default=feed.retain_events,
        help=f"events kept per object for resuming subscribers (default {feed.retain_events})",
    )
    serve.add_argument(
        "--feed-retain-bytes",
        type=int,
        default=feed.retain_bytes,
        help=f"bytes of events kept per object for resuming (default {feed.retain_bytes})",
    )
    serve.add_argument(
        "--feed-retain-total-bytes",
        type=int,
        default=feed.retain_total_bytes,
        help=f"bytes of events kept for resuming by all open objects together, oldest dropped first "
        f"(default {feed.retain_total_bytes})",
    )
    for retired in ("--subscriber-queue-events", "--subscriber-queue-bytes"):
        # Subscribers keep no queue now (they read the retained events): still accepted, so that
        # a deployment naming them starts, and warned about.
        serve.add_argument(retired, type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument(
        "--event-loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="event loop: uvloop (a quarter less loop CPU per call) or asyncio; auto picks uvloop when installed",
    )
    serve.add_argument(
        "--keepalive-seconds",
        type=float,
        default=DEFAULT_KEEPALIVE_SECONDS,
        help=f"ping a connection silent this long; close it if unanswered (default {DEFAULT_KEEPALIVE_SECONDS:g})",
    )
    serve.add_argument(
        "--keepalive-timeout-seconds",
        type=float,
        default=DEFAULT_KEEPALIVE_TIMEOUT_SECONDS,
        help=f"how long a keepalive ping may go unanswered (default {DEFAULT_KEEPALIVE_TIMEOUT_SECONDS:g})",
    )
    serve.add_argument(
        "--min-client-ping-seconds",
        type=float,
        default=DEFAULT_MIN_CLIENT_PING_SECONDS,
        help=f"shortest interval of client keepalive pings accepted (default {DEFAULT_MIN_CLIENT_PING_SECONDS:g})",
    )
    serve.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    mover = commands.add_parser("move-object", help="move an object from one server to another, verified")
    mover.add_argument("--object-key", required=True, action="append", help="the object to move (repeatable)")
    mover.add_argument("--from", dest="source", required=True, help="source server address")
    mover.add_argument("--to", dest="destination", required=True, help="destination server address")
    mover.add_argument("--token", help="bearer token valid on both servers (or SESSIONS_TOKEN)")
    mover.add_argument(
        "--replace",
        action="store_true",
        help="overwrite the object where the destination already holds it (a copy an earlier attempt of "
        "the move left; without it such an object is not moved)",
    )
    aborter = commands.add_parser(
        "abort-move",
        help="release the move lock of an object whose move was cut short (AbortMove), so it takes writes again",
        description="Release the move lock an object holds on a server after a move was cut short "
        "(move-object or deploy/reshard.py killed after the locked export), instead of waiting out "
        "the lock's lease. Only when no move of the object is running: a running move would go on to "
        "delete the object from the server, writes accepted after the release included.",
    )
    aborter.add_argument(
        "--object-key", required=True, action="append", help="the object whose lock to release (repeatable)"
    )
    aborter.add_argument("--from", dest="source", required=True, help="the server holding the lock (the move's source)")
    aborter.add_argument("--token", help="bearer token for the server (or SESSIONS_TOKEN)")
    hasher = commands.add_parser("hash-token", help="print the SHA-256 of a bearer token, for the tokens file")
    hasher.add_argument("token", nargs="?", help="the token (read from standard input when omitted)")
    imp = commands.add_parser(
        "import-store",
        help="copy an upstream store file (e.g. a workerd Durable Object SQLite file) in as an object",
    )
    imp.add_argument("file", type=Path, help="the SQLite file to import (left unchanged)")
    imp.add_argument("--object-key", required=True, help="the object key it becomes")
    where = imp.add_mutually_exclusive_group()
    where.add_argument(
        "--data-dir", type=Path, help="the data directory of a server that is not running (default ./data)"
    )
    where.add_argument(
        "--to",
        dest="address",
        help="send the file to this running server instead (ImportObject; its own limits apply)",
    )
    imp.add_argument("--token", help="bearer token for --to (or SESSIONS_TOKEN)")
    imp.add_argument("--replace", action="store_true", help="overwrite an existing object")
    _add_text_limit_flags(imp)
    return parser


def _add_text_limit_flags(parser: argparse.ArgumentParser) -> None:
    """Limits on the texts reads send beside each frame: `serve` refuses writes past them, and
    `import-store` files holding rows past them."""
    limits = Limits()
    parser.add_argument(
        "--max-message-id-bytes",
        type=int,
        default=limits.max_message_id_bytes,
        help=f"longest message id, bytes (default {limits.max_message_id_bytes})",
    )
    parser.add_argument(
        "--max-role-bytes",
        type=int,
        default=limits.max_role_bytes,
        help=f"longest message role, bytes (default {limits.max_role_bytes})",
    )
    parser.add_argument(
        "--max-summary-bytes",
        type=int,
        default=limits.max_summary_bytes,
        help=f"longest compaction summary, bytes (default {limits.max_summary_bytes})",
    )


def _text_limits(args: argparse.Namespace) -> Limits:
    return Limits(
        max_message_id_bytes=args.max_message_id_bytes,
        max_role_bytes=args.max_role_bytes,
        max_summary_bytes=args.max_summary_bytes,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "move-object":
        return _move_objects(args.source, args.destination, args.object_key, args.token, replace=args.replace)
    if args.command == "abort-move":
        return _abort_moves(args.source, args.object_key, args.token)
    if args.command == "hash-token":
        from sessions_server.transport.auth import hash_token

        token = args.token if args.token is not None else sys.stdin.readline().strip()
        print(hash_token(token))
        return 0
    if args.command == "import-store":
        if args.address:
            return _send_store(args.file, args.object_key, args.address, args.token, replace=args.replace)
        data_dir = args.data_dir or Path("./data")
        return _import_store(args.file, args.object_key, data_dir, replace=args.replace, limits=_text_limits(args))
    for name in ("progress_seconds", "search_seconds", "max_concurrent_searches"):
        if getattr(args, name) <= 0:  # 0 would spin every idle feed, refuse every search
            parser.error(f"--{name.replace('_', '-')} must be greater than 0")
    if args.max_streams_per_token < 0:  # would refuse every stream of every token
        parser.error("--max-streams-per-token must be 0 (no bound of its own) or more")
    _configure_logging(args.log_level, args.log_format)
    for retired in ("subscriber_queue_events", "subscriber_queue_bytes"):
        if getattr(args, retired) is not None:
            logging.getLogger("sessions.server").warning(
                "--%s is no longer used: subscribers read the retained events and fall behind only past "
                "--feed-retain-events / --feed-retain-bytes",
                retired.replace("_", "-"),
            )
    paths.set_message_budget(args.message_memo_bytes)
    packed_cache.set_budget(args.message_memo_bytes // 3)
    config = ServerConfig(
        data_dir=args.data_dir,
        listen=args.listen,
        reserved_metadata_keys=tuple(args.reserved_metadata_key),
        max_request_bytes=args.max_request_bytes,
        max_open_objects=args.max_open_objects,
        max_object_key_bytes=args.max_object_key_bytes,
        drain_seconds=args.drain_seconds,
        progress_seconds=args.progress_seconds,
        keepalive_seconds=args.keepalive_seconds,
        keepalive_timeout_seconds=args.keepalive_timeout_seconds,
        min_client_ping_seconds=args.min_client_ping_seconds,
        idle_seconds=args.idle_seconds,
        search_seconds=args.search_seconds,
        max_concurrent_searches=args.max_concurrent_searches,
        max_query_bytes=args.max_query_bytes,
        summarizer_url=args.summarizer_url,
        summarizer_model=args.summarizer_model,
        summarizer_api_key_env=args.summarizer_api_key_env,
        summarizer_timeout_seconds=args.summarizer_timeout_seconds,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        allow_plaintext=args.allow_plaintext,
        tokens_file=args.tokens_file,
        auth_protect_reflection=args.auth_protect_reflection,
        ring_file=args.ring_file,
        require_routing_header=args.require_routing_header,
        metrics_listen=args.metrics_listen,
        feed=FeedSettings(
            retain_events=args.feed_retain_events,
            retain_bytes=args.feed_retain_bytes,
            retain_total_bytes=args.feed_retain_total_bytes,
        ),
        limits=Limits(
            max_client_message_bytes=args.max_client_message_bytes,
            max_object_bytes=args.max_object_bytes,
            max_subscribers_per_object=args.max_subscribers_per_object,
            max_concurrent_streams=args.max_concurrent_streams,
            max_streams_per_token=args.max_streams_per_token,
            max_message_id_bytes=args.max_message_id_bytes,
            max_role_bytes=args.max_role_bytes,
            max_summary_bytes=args.max_summary_bytes,
            max_assembly_bytes=args.max_assembly_bytes,
        ),
    )
    return _run_on_event_loop(args.event_loop, lambda: _run(config))


def _run_on_event_loop(choice: str, main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                print("sessions-server: --event-loop uvloop, but uvloop is not installed", file=sys.stderr)
                return 2
        else:
            return uvloop.run(main())
    return asyncio.run(main())


def _configure_logging(level: str, log_format: str) -> None:
    from sessions_server.transport.metrics import JsonFormatter, RequestIdFilter

    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def _move_objects(
    source: str, destination: str, object_keys: list[str], token: str | None, *, replace: bool = False
) -> int:
    """Moves each key in turn; a key that fails is reported and the others still move. Exits 1
    when any failed, after a summary naming each with its reason."""
    import os

    from sessions_client import SessionsClient, SessionsError
    from sessions_client.admin import move_object

    token = token or os.environ.get("SESSIONS_TOKEN")
    failed: list[tuple[str, str]] = []
    with SessionsClient(source, token=token) as src, SessionsClient(destination, token=token) as dst:
        for key in object_keys:
            try:
                report = move_object(src, dst, key, destination_name=destination, replace=replace)
            except SessionsError as exc:
                reason = _move_failure(source, key, exc)
                failed.append((key, reason))
                print(f"sessions-server move-object: {key!r} not moved: {reason}", file=sys.stderr, flush=True)
                continue
            print(
                f"moved {key!r}: {report.size_bytes} bytes, {report.message_rows} messages -> {destination}",
                flush=True,
            )
    if failed:
        moved = len(object_keys) - len(failed)
        print(
            f"sessions-server move-object: {len(failed)} of {len(object_keys)} objects not moved "
            f"({moved} moved) from {source} to {destination}:",
            file=sys.stderr,
        )
        for key, reason in failed:
            print(f"  {key!r}: {reason}", file=sys.stderr)
        return 1
    return 0


def _move_failure(source: str, key: str, exc: Exception) -> str:
    """One line saying why `key` did not move, and what to do when the operator can act."""
    import shlex

    from sessions_client import SessionsError

    text = " ".join(str(exc).split())  # one line, whatever the server's message holds
    if isinstance(exc, SessionsError) and "already exists here" in exc.message:
        return (
            f"{exc.code.name}: the destination already holds this object (a copy an earlier attempt of this "
            "move left, or an object of its own): nothing was changed; check it, then move it again with "
            "--replace to overwrite it"
        )
    if isinstance(exc, SessionsError) and exc.reason == "OBJECT_MOVING":
        command = f"sessions-server abort-move --from {shlex.quote(source)} --object-key {shlex.quote(key)}"
        return (
            f"{exc.code.name} [OBJECT_MOVING]: a move of this object is under way or was cut short; "
            f"if none is running, release it with `{command}` and move it again"
        )
    return text


def _abort_moves(source: str, object_keys: list[str], token: str | None) -> int:
    """Releases the move lock of each key (AbortMove); exits 1 when a call failed."""
    import os

    from sessions_client import SessionsClient, SessionsError
    from sessions_client.admin import abort_move

    token = token or os.environ.get("SESSIONS_TOKEN")
    failures = 0
    with SessionsClient(source, token=token) as client:
        for key in object_keys:
            try:
                released = abort_move(client, key)
            except SessionsError as exc:
                failures += 1
                reason = " ".join(str(exc).split())
                print(f"sessions-server abort-move: {key!r} on {source}: {reason}", file=sys.stderr, flush=True)
                continue
            if released:
                print(f"released the move lock of {key!r} on {source}: it takes writes again", flush=True)
            else:
                print(f"{key!r} on {source} held no move lock: nothing to release", flush=True)
    return 1 if failures else 0


def _import_store(source: Path, object_key: str, data_dir: Path, *, replace: bool, limits: Limits) -> int:
    from sessions_server.domain.limits import stored_text_limits
    from sessions_server.storage.datadir import DataDirectoryInUse, DataDirectoryLock
    from sessions_server.storage.files import ObjectExists, StoreImportError, import_store_file
    from sessions_server.storage.moved import MovedObjects
    from sessions_server.storage.rows import StorageError

    try:
        # A running server keeps what it knows of its files in memory: one that had the object
        # open would go on writing the file this replaces. `--to` brings a file in through it.
        lock = DataDirectoryLock.acquire(data_dir, "sessions-server import-store")
        try:
            # Brought (back) here: no longer refused as moved away (as ImportObject does), and a
            # file a delete cut short left for the key is no object, so it is replaced.
            moved = MovedObjects(data_dir)
            target = import_store_file(
                source,
                object_key,
                data_dir,
                replace=replace or object_key in moved,
                text_limits=stored_text_limits(limits),
            )
            moved.forget(object_key)
        finally:
            lock.release()
    except DataDirectoryInUse as exc:
        print(
            f"sessions-server import-store: {exc}: stop it first, or send the file to it with --to ADDRESS",
            file=sys.stderr,
        )
        return 1
    except ObjectExists as exc:
        print(f"sessions-server import-store: {exc} (use --replace)", file=sys.stderr)
        return 1
    except (StoreImportError, StorageError, OSError) as exc:  # the file's fault, or the disk's
        print(f"sessions-server import-store: {exc}", file=sys.stderr)
        return 1
    print(f"imported {source} as object {object_key!r} at {target}")
    return 0


def _send_store(source: Path, object_key: str, address: str, token: str | None, *, replace: bool) -> int:
    import os

    from sessions_client import SessionsClient, SessionsError
    from sessions_client.admin import import_file

    token = token or os.environ.get("SESSIONS_TOKEN")
    try:
        with SessionsClient(address, token=token) as client:
            report = import_file(client, object_key, source, replace=replace)
    except (SessionsError, OSError) as exc:
        print(f"sessions-server import-store: {exc}", file=sys.stderr)
        return 1
    print(f"imported {source} as object {object_key!r} on {address}: {report.message_rows} messages")
    return 0


YOUNG_COLLECTION_THRESHOLD = 10_000
"""Net container allocations between young-generation collections (CPython's default is 700)."""


def _tune_garbage_collector() -> None:
    """Keep the cyclic collector off the request path.

    With CPython's default threshold one `AppendMessages` of 100 messages ran two young
    collections: its short-lived objects were promoted and then swept again by full collections
    that walk every remembered message (27-40 ms each, about 6% of the server's time). A larger
    young generation lets a request's objects die by reference count first. Freezing moves what
    startup built (modules, descriptors) out of every later collection.
    """
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD)


def _tune_allocator() -> bool:
    """Whether malloc's thresholds are the server's (then freed heap goes back when idle)."""
    log = logging.getLogger("sessions.server")
    if allocator.reuse_large_buffers():
        log.info(
            "malloc: buffers up to %d MiB come from the heap, up to %d MiB of it kept when free "
            "and handed back when the server goes idle",
            allocator.MMAP_THRESHOLD_BYTES >> 20,
            allocator.TRIM_THRESHOLD_BYTES >> 20,
        )
        return True
    log.info("malloc: thresholds left as they are (another C library, or set in the environment)")
    return False


# Past this, the kernel refuses a soft limit however high the hard one is (Linux's nr_open).
MAX_OPEN_FILES = 1 << 20


def _raise_open_files_limit() -> None:
    """Raises the soft limit on open files to the hard one. An open object holds a writer and up
    to four reader connections, each with its file, WAL and shared memory open, and every client
    connection and subscriber stream needs its share: --max-open-objects 256 alone can take
    thousands of descriptors, past the common soft limit of 1,024, where calls fail with
    "Too many open files"."""
    import resource

    log = logging.getLogger("sessions.server")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (OSError, ValueError) as exc:
            log.warning("open files: could not raise the limit from %d to %d: %s", soft, wanted, exc)
            return
        log.info("open files: limit raised from %d to %d", soft, wanted)


async def _run(config: ServerConfig) -> int:
    from sessions_server.transport.server import serve

    _tune_garbage_collector()
    tuned = _tune_allocator()
    _raise_open_files_limit()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(config, stop, on_idle=allocator.release_free_heap if tuned else None)
    except (OSError, ValueError) as exc:
        print(f"sessions-server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
