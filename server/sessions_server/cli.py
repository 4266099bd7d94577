"""The `sessions-server` command."""

from __future__ import annotations

import os

# gRPC reads this once, as it is imported (below, through the server's modules). Its own log lines
# under ERROR (a client's GOAWAY, say) tell an operator nothing to act on; set in the environment,
# GRPC_VERBOSITY still wins. Not NONE: its ERROR lines are the only word of some failures (a
# listener's accept failing, say). The one it printed above the server's own for a port in use
# no longer comes: the server tries the port itself first (transport/server.py, `_bind_refusal`).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import asyncio
import dataclasses
import gc
import logging
import math
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessions_server import allocator, version
from sessions_server.config import (
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_KEEPALIVE_SECONDS,
    DEFAULT_KEEPALIVE_TIMEOUT_SECONDS,
    DEFAULT_LISTEN,
    DEFAULT_MAX_CONNECTION_AGE_GRACE_SECONDS,
    DEFAULT_MAX_CONNECTION_IDLE_SECONDS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
    DEFAULT_MIN_CLIENT_PING_SECONDS,
    ServerConfig,
    split_host_port,
)
from sessions_server.domain import paths
from sessions_server.domain.keys import LARGEST_KEY_LIMIT_BYTES, MAX_OBJECT_KEY_BYTES
from sessions_server.domain.limits import RESPONSE_PAYLOAD_BYTES, Limits
from sessions_server.domain.objects import MAX_LEASE_SECONDS as MAX_MOVE_LEASE_SECONDS
from sessions_server.domain.search import DEFAULT_CONCURRENT_SEARCHES
from sessions_server.storage.feed import FeedSettings
from sessions_server.storage.registry import DEFAULT_MAX_OPEN_OBJECTS
from sessions_server.transport import packed_cache

if TYPE_CHECKING:
    from sessions_client import SessionsClient, TlsConfig

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _listen_address(text: str) -> str:
    """`--listen`: HOST:PORT, port 0 for one the system picks."""
    try:
        split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}; expected HOST:PORT, PORT from 0 to 65535") from None
    return text


def _metrics_address(text: str) -> str:
    """`--metrics-listen`: HOST:PORT with a port of its own; a port the system picked would be
    told to nobody, so no scraper could find it."""
    try:
        _, port = split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}; expected HOST:PORT, PORT from 1 to 65535") from None
    if port == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: port 0 would pick a port nobody is told; give PORT from 1 to 65535"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessions-server", description="Sessions gRPC server")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    # Its usage names only a few flags: argparse's own (every flag, 45 lines) buried the one line
    # saying what was wrong with the command.
    serve = commands.add_parser(
        "serve", help="run the server", usage="%(prog)s [--listen HOST:PORT] [--data-dir DIR] [option ...]"
    )
    serve.set_defaults(command_parser=serve)
    serve.add_argument(
        "--listen",
        type=_listen_address,
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help="address to bind: IPv4 address, [IPv6 address] or hostname, and a port; port 0 picks a free one, "
        f"printed at start (default {DEFAULT_LISTEN})",
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
        help=f"grace period for in-flight calls on shutdown, seconds; 0 cancels them at once "
        f"(default {DEFAULT_DRAIN_SECONDS})",
    )
    serve.add_argument(
        "--progress-seconds",
        type=float,
        default=ServerConfig.progress_seconds,
        help=f"idle interval of Subscribe progress events (default {ServerConfig.progress_seconds:g})",
    )
    serve.add_argument(
        "--search-seconds",
        type=float,
        default=ServerConfig.search_seconds,
        help=f"time a search may wait for a slot, then run (default {ServerConfig.search_seconds:g})",
    )
    serve.add_argument(
        "--max-concurrent-searches",
        type=int,
        default=DEFAULT_CONCURRENT_SEARCHES,
        help="searches run at once, server-wide; more wait (up to their time budget, then "
        "RESOURCE_EXHAUSTED/SERVER_BUSY; with --tokens-file, a freed slot goes to the token with the fewest "
        f"running), leaving SQL threads to other calls (default {DEFAULT_CONCURRENT_SEARCHES})",
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
        "--max-query-bytes",
        type=int,
        default=ServerConfig.max_query_bytes,
        help=f"longest search query, UTF-8 bytes (default {ServerConfig.max_query_bytes})",
    )
    serve.add_argument("--summarizer-url", help="OpenAI-compatible base URL for server-side compaction")
    # These three default to None so that one given without --summarizer-url can be told apart
    # (`_summarizer_settings`), where it would be ignored without a word.
    serve.add_argument(
        "--summarizer-model",
        help=f"model name sent to the summarizer (default {ServerConfig.summarizer_model})",
    )
    serve.add_argument(
        "--summarizer-api-key-env",
        help=f"environment variable holding the summarizer's API key (default {ServerConfig.summarizer_api_key_env})",
    )
    serve.add_argument(
        "--summarizer-timeout-seconds",
        type=float,
        help=f"a summarizer call's deadline, answer included (default {ServerConfig.summarizer_timeout_seconds:g})",
    )
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
        f"together (with --tokens-file, shared fairly among the tokens once half is held), and an eighth more "
        f"(at most 64 MiB) for writes of up to 1 MiB (default {limits.max_assembly_bytes})",
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
        help="concurrent streaming calls per server (with --tokens-file, shared fairly among the tokens once "
        f"half are taken) (default {limits.max_concurrent_streams})",
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
    serve.add_argument(
        "--metrics-listen",
        type=_metrics_address,
        metavar="HOST:PORT",
        help="address of a Prometheus /metrics endpoint (HTTP, no TLS)",
    )
    serve.add_argument(
        "--probe-listen",
        type=_listen_address,
        metavar="HOST:PORT",
        help="address of a port serving gRPC health alone, in plaintext, for probes (kubelet's gRPC probe); "
        "its requests are small, so that callers without a token cannot make the server hold large ones; "
        "with --tokens-file, health on --listen then needs a token (port 0 picks a free one, printed at start)",
    )
    serve.add_argument("--log-format", choices=("text", "json"), default="text", help="log line format (default text)")
    _add_text_limit_flags(serve)
    feed = FeedSettings()
    serve.add_argument(
        "--feed-retain-events",
        type=int,
        default=feed.retain_events,
        help=f"events kept per watched object for resuming subscribers (default {feed.retain_events})",
    )
    serve.add_argument(
        "--feed-retain-bytes",
        type=int,
        default=feed.retain_bytes,
        help=f"bytes of events kept per watched object for resuming (default {feed.retain_bytes})",
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
    serve.add_argument(
        "--max-streams-per-connection",
        type=int,
        default=DEFAULT_MAX_STREAMS_PER_CONNECTION,
        help="HTTP/2 streams (calls) one client connection may have open at once; its next ones wait for one "
        f"to end (default {DEFAULT_MAX_STREAMS_PER_CONNECTION})",
    )
    serve.add_argument(
        "--max-connection-idle-seconds",
        type=float,
        default=DEFAULT_MAX_CONNECTION_IDLE_SECONDS,
        help="close a client connection without a call for this long; the client reconnects at its next call; "
        f"0 for never (default {DEFAULT_MAX_CONNECTION_IDLE_SECONDS:g})",
    )
    serve.add_argument(
        "--max-connection-age-seconds",
        type=float,
        default=0.0,
        help="ask a client connection this old (give or take a tenth) to go: the client opens a new one for its "
        "next calls, so that a certificate or CA taken out of --tls-client-ca, or a new server behind a TCP load "
        "balancer, reaches clients that stay connected; 0 for never (default 0)",
    )
    serve.add_argument(
        "--max-connection-age-grace-seconds",
        type=float,
        help="with --max-connection-age-seconds, how long the calls still open on an old connection may go on before "
        "it closes under them (change feeds then resume on a new connection; any other call fails, copies of whole "
        "objects by move-object, export-store and import-store included) "
        f"(default {DEFAULT_MAX_CONNECTION_AGE_GRACE_SECONDS:g})",
    )
    serve.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="WARNING",
        help="logging level, in any case (default WARNING)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per call (method, status, reason, duration, the object's file digest, peer), at DEBUG "
        "from the sessions.access logger, whatever --log-level says (DEBUG would also turn on gRPC's own "
        "debug lines)",
    )
    mover = commands.add_parser("move-object", help="move an object from one server to another, verified")
    mover.set_defaults(command_parser=mover)
    mover.add_argument(
        "--object-key",
        required=True,
        action="append",
        help="the object to move (repeatable; a key starting with '-' as --object-key=KEY)",
    )
    mover.add_argument("--from", dest="source", required=True, help="source server address")
    mover.add_argument("--to", dest="destination", required=True, help="destination server address")
    mover.add_argument(
        "--token",
        help='bearer token valid on both servers, granting every key (prefix ""); better in SESSIONS_TOKEN '
        "(an argument shows in ps and the shell's history)",
    )
    mover.add_argument(
        "--replace",
        action="store_true",
        help="overwrite the object where the destination already holds it (a copy an earlier attempt of "
        "the move left; without it such an object is not moved)",
    )
    mover.add_argument(
        "--lease-seconds",
        type=_lease_seconds,
        default=MOVE_LEASE_SECONDS,
        help="how long the source's lock outlives a mover that dies mid-move "
        f"(1 to 86400; default {MOVE_LEASE_SECONDS}): it must cover sending, installing and checking the object",
    )
    _add_client_tls_flags(mover, "both servers (--from and --to)")
    aborter = commands.add_parser(
        "abort-move",
        help="release the move lock of an object whose move was cut short (AbortMove), so it takes writes again",
        description="Release the move lock an object holds on a server after a move was cut short "
        "(move-object or deploy/reshard.py killed after the locked export), instead of waiting out "
        "the lock's lease. Only when no move of the object is running: its delete would be refused "
        "(writes accepted after the release are not in its copy), and one run with --replace that is "
        "still sending its copy would replace what the destination holds until it fails.",
    )
    aborter.set_defaults(command_parser=aborter)
    aborter.add_argument(
        "--object-key",
        required=True,
        action="append",
        help="the object whose lock to release (repeatable; a key starting with '-' as --object-key=KEY)",
    )
    aborter.add_argument(
        "--from",
        dest="source",
        required=True,
        help="the server holding the lock (the move's source; with --release-hold, its destination)",
    )
    aborter.add_argument(
        "--release-hold",
        action="store_true",
        help="--from is a move's destination: release the hold it keeps on the copy it received, so the copy "
        "takes writes. Only once the move's source refuses the key (OBJECT_NOT_OWNED): while the source still "
        "holds the object both would take writes; move it again with --replace instead. Without this flag "
        "such a hold is left alone and reported",
    )
    aborter.add_argument(
        "--token", help="bearer token for the server, granting every key; better in SESSIONS_TOKEN (shows in ps)"
    )
    _add_client_tls_flags(aborter, "the server")
    hasher = commands.add_parser(
        "hash-token",
        help="print the SHA-256 of a bearer token, for the tokens file",
        description="Print the SHA-256 of a bearer token, for the tokens file. Give the token on standard "
        "input (`sessions-server hash-token < token.txt`, or typed at the prompt): an argument is seen by "
        "every user of the machine (ps) and kept in the shell's history.",
    )
    hasher.set_defaults(command_parser=hasher)
    hasher.add_argument(
        "token",
        nargs="?",
        help="the token; better omitted, to read it from standard input (an argument shows in ps and the "
        "shell's history)",
    )
    imp = commands.add_parser(
        "import-store",
        help="copy an upstream store file (e.g. a workerd Durable Object SQLite file) in as an object",
        usage="%(prog)s FILE --object-key KEY [--data-dir DIR | --to ADDRESS] [option ...]",
    )
    imp.set_defaults(command_parser=imp)
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
    imp.add_argument("--token", help="bearer token for --to; better in SESSIONS_TOKEN (an argument shows in ps)")
    imp.add_argument("--replace", action="store_true", help="overwrite an existing object")
    imp.add_argument(
        "--max-object-key-bytes",
        type=int,
        default=MAX_OBJECT_KEY_BYTES,
        help=f"longest object key taken, UTF-8 bytes, as the server's flag (default {MAX_OBJECT_KEY_BYTES})",
    )
    _add_text_limit_flags(imp)
    imp.add_argument(
        "--max-assembly-bytes",
        type=int,
        default=Limits().max_assembly_bytes,
        help="the largest a message may read back with its attachments inline, as the server's flag "
        f"(default {Limits().max_assembly_bytes})",
    )
    _add_client_tls_flags(imp, "the server of --to")
    exp = commands.add_parser(
        "export-store",
        help="save a consistent copy of an object's SQLite file from a running server (import-store takes it back)",
        usage="%(prog)s FILE --object-key KEY --from ADDRESS [option ...]",
    )
    exp.set_defaults(command_parser=exp)
    exp.add_argument("file", type=Path, help="where to save the copy (written beside it, then renamed into place)")
    exp.add_argument("--object-key", required=True, help="the object to copy (it keeps taking writes meanwhile)")
    exp.add_argument("--from", dest="source", required=True, help="the server holding the object")
    exp.add_argument("--token", help="bearer token for the server; better in SESSIONS_TOKEN (an argument shows in ps)")
    exp.add_argument("--force", action="store_true", help="overwrite FILE when it exists")
    _add_client_tls_flags(exp, "the server")
    return parser


def _add_client_tls_flags(parser: argparse.ArgumentParser, servers: str) -> None:
    """How an admin command reaches servers that speak TLS (`serve --tls-cert`)."""
    tls = parser.add_argument_group(
        "TLS",
        f"Plaintext unless one of these is given; they apply to {servers}. With mTLS (serve --tls-client-ca), "
        "give --tls-cert and --tls-key too.",
    )
    tls.add_argument("--tls", action="store_true", help="use TLS, trusting the system's root certificates")
    tls.add_argument(
        "--tls-ca", type=Path, metavar="PEM", help="use TLS, trusting the CA certificates in this file instead"
    )
    tls.add_argument("--tls-cert", type=Path, metavar="PEM", help="client certificate chain (mTLS; implies --tls)")
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")


def _client_tls(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TlsConfig | None:
    """The TLS settings the admin flags ask for; None for plaintext."""
    from sessions_client import TlsConfig

    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_key):
        return None
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together: give both for a client certificate, or neither")

    def pem(flag: str, path: Path | None, kind: str) -> bytes | None:
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except OSError as exc:
            parser.error(f"{flag} {path}: cannot read it ({exc.strerror}); expected a PEM file of {kind}")
        # gRPC takes any bytes here and fails only at the handshake, with a message about the
        # connection rather than the file.
        if b"-----BEGIN " not in data:
            parser.error(f"{flag} {path}: not a PEM file; expected {kind}")
        return data

    config = TlsConfig(
        root_certificates=pem("--tls-ca", args.tls_ca, "CA certificates"),
        certificate_chain=pem("--tls-cert", args.tls_cert, "a certificate chain"),
        private_key=pem("--tls-key", args.tls_key, "a private key"),
    )
    if args.tls_cert is not None and args.tls_key is not None:
        # A key of another certificate failed every call with "Failed to create security
        # handshaker", naming neither file.
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(args.tls_cert, args.tls_key, password=lambda: b"")
        except (ssl.SSLError, OSError) as exc:
            parser.error(
                f"--tls-cert {args.tls_cert} and --tls-key {args.tls_key} are no certificate chain and matching "
                f"private key in PEM ({exc})"
            )
    return config


def _tls_flags(args: argparse.Namespace) -> list[str]:
    """The TLS flags of this command line, to repeat in a command suggested to the operator."""
    flags = ["--tls"] if args.tls else []
    for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None:
            flags += [flag, str(path)]
    return flags


@dataclass(frozen=True)
class _Range:
    """The values a numeric flag takes: more than 0, and 0 too when 0 means something of its
    own; at most `most` where a larger value would not fit where it goes."""

    zero: str | None = None  # what 0 means, when 0 is allowed
    least: float | None = None  # the smallest value above 0 allowed, when not any
    most: int | None = None
    why: str = ""  # why `least` or `most`


_GRPC_INT = 2**31 - 1  # gRPC's channel arguments are C ints
# Sent to gRPC in whole milliseconds: less than one would go as 0, more than its int holds fails.
_MILLISECONDS = _Range(least=0.001, most=_GRPC_INT // 1000, why="gRPC takes it in whole milliseconds, as a 32-bit int")

# Each is sent whole: a summary in a response, ids and a role beside every piece of a message (at
# most RESPONSE_PAYLOAD_BYTES of a 4 MiB response). Past these, writes would be stored and answered
# with RESOURCE_EXHAUSTED, and every later read of them too.
_BESIDE_A_PIECE = _Range(most=128 * 1024, why="sent beside each piece of a message, in the 4 MiB of a response")
_TEXT_LIMIT_RANGES = {
    "max_message_id_bytes": _BESIDE_A_PIECE,
    "max_role_bytes": _BESIDE_A_PIECE,
    "max_summary_bytes": _Range(most=RESPONSE_PAYLOAD_BYTES, why="a summary is sent whole, in a response's payload"),
}

_OBJECT_KEY_RANGE = _Range(
    most=LARGEST_KEY_LIMIT_BYTES, why="clients send the key in a header too, up to three times as long"
)

# Every numeric flag of `serve`: tests/e2e/test_cli_flags.py tries each flag the parser has.
_SERVE_RANGES = {
    "max_request_bytes": _Range(most=_GRPC_INT, why="gRPC's largest message, a 32-bit int"),
    "max_open_objects": _Range(),
    "message_memo_bytes": _Range(zero="off"),
    "max_object_key_bytes": _OBJECT_KEY_RANGE,
    "drain_seconds": _Range(zero="in-flight calls are cancelled at once"),
    # 0 would spin every idle feed, and so nearly would 1e-7 (10,324 progress events in 3 s).
    "progress_seconds": _Range(least=0.05, why="every idle subscription sends a progress event as often"),
    "search_seconds": _Range(),  # 0 would refuse every search
    "max_concurrent_searches": _Range(),
    "idle_seconds": _Range(zero="never"),
    "max_query_bytes": _Range(),
    "summarizer_timeout_seconds": _Range(),
    "max_client_message_bytes": _Range(zero="no limit"),
    "max_object_bytes": _Range(),
    "max_assembly_bytes": _Range(),
    "max_subscribers_per_object": _Range(),
    "max_concurrent_streams": _Range(),
    "max_streams_per_token": _Range(zero="no bound of its own"),  # negative refused every stream
    "feed_retain_events": _Range(),
    "feed_retain_bytes": _Range(),
    "feed_retain_total_bytes": _Range(),
    "keepalive_seconds": _MILLISECONDS,
    "keepalive_timeout_seconds": _MILLISECONDS,
    "min_client_ping_seconds": _MILLISECONDS,
    "max_streams_per_connection": _Range(most=_GRPC_INT, why="gRPC takes it as a 32-bit int"),
    "max_connection_idle_seconds": _Range(
        zero="never", least=0.001, most=_GRPC_INT // 1000, why="gRPC takes it in whole milliseconds, as a 32-bit int"
    ),
    "max_connection_age_seconds": _Range(
        zero="never", least=0.001, most=_GRPC_INT // 1000, why="gRPC takes it in whole milliseconds, as a 32-bit int"
    ),
    "max_connection_age_grace_seconds": _MILLISECONDS,
    **_TEXT_LIMIT_RANGES,
}


def _out_of_range(name: str, value: float, allowed: _Range) -> str | None:
    """What is wrong with `value` for the flag `name`, or None."""
    flag = "--" + name.replace("_", "-")
    shown = repr(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        shown = str(int(value))  # -1, as typed, rather than -1.0
    if not math.isfinite(value):
        return f"{flag} must be a finite number, not {shown}"
    if value < 0 or (value == 0 and allowed.zero is None):
        if allowed.zero is not None:
            return f"{flag} must be 0 ({allowed.zero}) or more, not {shown}"
        return f"{flag} must be greater than 0, not {shown}"
    if allowed.least is not None and 0 < value < allowed.least:
        return f"{flag} must be at least {allowed.least:g} ({allowed.why}), not {shown}"
    if allowed.most is not None and value > allowed.most:
        return f"{flag} must be at most {allowed.most} ({allowed.why}), not {shown}"
    return None


def _check_object_key(parser: argparse.ArgumentParser, object_key: str, max_bytes: int) -> None:
    """A key every call would refuse (empty, a control character, too long) is refused here:
    installed, its object could be listed but never read, moved or erased."""
    from sessions_server.domain.errors import InvalidArgument
    from sessions_server.domain.keys import check_object_key

    try:
        check_object_key(object_key, max_bytes=max_bytes)
    except InvalidArgument as exc:
        parser.error(f"--object-key: {exc.message}")


def _check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace, ranges: dict[str, _Range]) -> None:
    for name, allowed in ranges.items():
        if getattr(args, name) is None:  # not given, and its default is filled in later
            continue
        problem = _out_of_range(name, getattr(args, name), allowed)
        if problem is not None:
            parser.error(problem)


def _data_dir_problem(data_dir: Path) -> str | None:
    """Why `data_dir` cannot be a data directory: it, or the nearest of its parents that exists,
    is not a directory (the OS says only "File exists" or "Not a directory")."""
    for path in (data_dir, *data_dir.parents):
        if path.is_dir():
            return None
        if path.exists() or path.is_symlink():  # a dangling link too: the OS would not follow it
            what = "a file" if path.is_file() else "not a directory"
            where = "" if path == data_dir else f" (its parent {path})"
            return f"--data-dir {data_dir}{where} is {what}; expected a directory, or a path where one can be made"
    return None


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


def _token_to_hash(parser: argparse.ArgumentParser, given: str | None) -> str:
    """hash-token's token: the argument, else standard input's first line (prompted for, not
    echoed, on a terminal). An empty one is refused: its hash would go into a tokens file as a
    grant anyone holds who sends an empty token."""
    if given is not None:
        token = given
    elif sys.stdin is not None and sys.stdin.isatty():
        import getpass

        token = getpass.getpass("token: ")
    else:
        token = sys.stdin.readline().strip() if sys.stdin is not None else ""
    if not token.strip():
        where = "the argument" if given is not None else "standard input"
        parser.error(f"the token is empty ({where}): give the token on standard input, or as the argument")
    return token


_SUMMARIZER_SETTINGS = {
    "summarizer_model": ServerConfig.summarizer_model,
    "summarizer_api_key_env": ServerConfig.summarizer_api_key_env,
    "summarizer_timeout_seconds": ServerConfig.summarizer_timeout_seconds,
}


def _summarizer_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses a summarizer setting given without --summarizer-url (the server would have no
    summarizer, and compactions it was meant for would be refused long after the start), then
    fills in the defaults of those not given."""
    given = [name for name in _SUMMARIZER_SETTINGS if getattr(args, name) is not None]
    if given and args.summarizer_url is None:
        flags = " and ".join("--" + name.replace("_", "-") for name in given)
        parser.error(
            f"{flags} {'has' if len(given) == 1 else 'have'} no effect without --summarizer-url: give the "
            "summarizer's base URL too (e.g. https://api.openai.com/v1), or leave the summarizer settings out"
        )
    for name, default in _SUMMARIZER_SETTINGS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked as far as it can be without acting on it: a bad one exits 2
    with a line naming the flag, its value and what it takes. For the admin commands,
    `tls_config` holds the TLS settings the flags ask for (None: plaintext)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: argparse.ArgumentParser = args.command_parser
    if args.command == "serve":
        _check_ranges(command, args, _SERVE_RANGES)
        _summarizer_settings(command, args)
        if args.max_connection_age_grace_seconds is None:
            args.max_connection_age_grace_seconds = DEFAULT_MAX_CONNECTION_AGE_GRACE_SECONDS
        elif not args.max_connection_age_seconds:
            command.error(
                "--max-connection-age-grace-seconds has no effect without --max-connection-age-seconds: give the "
                "age too, or leave the grace out"
            )
        if (args.tls_cert is None) != (args.tls_key is None):
            command.error("--tls-cert and --tls-key go together: give both to serve TLS, or neither")
        if args.tls_client_ca is not None and args.tls_cert is None:
            command.error("--tls-client-ca needs --tls-cert and --tls-key: client certificates are asked for over TLS")
        if args.summarizer_url is not None:
            from sessions_server.integrations.chat_completions import base_url_problem, without_credentials

            # Else it failed only at the first compaction, long after the start.
            if (problem := base_url_problem(args.summarizer_url)) is not None:
                command.error(
                    f"--summarizer-url {without_credentials(args.summarizer_url)!r} is {problem}: "
                    "give the summarizer's base URL, e.g. https://api.openai.com/v1"
                )
    if args.command == "hash-token":
        args.token = _token_to_hash(command, args.token)
    if args.command == "import-store":
        _check_ranges(command, args, _TEXT_LIMIT_RANGES)
        _check_ranges(command, args, {"max_object_key_bytes": _OBJECT_KEY_RANGE})
        _check_object_key(command, args.object_key, args.max_object_key_bytes)
        if args.address is None and (args.tls or args.tls_ca or args.tls_cert or args.tls_key):
            command.error("--tls, --tls-ca, --tls-cert and --tls-key are for --to ADDRESS (a running server)")
    if args.command == "move-object" and args.source == args.destination:
        # The destination would be the source, locked by this very move: every run refused, and
        # the advice (abort-move, then again) led back to the same refusal.
        command.error(f"--from and --to name the same server ({args.source}): an object moves between two servers")
    if args.command == "export-store":
        _check_object_key(command, args.object_key, MAX_OBJECT_KEY_BYTES)
    if args.command in ("move-object", "abort-move", "import-store", "export-store"):
        args.tls_config = _client_tls(command, args)
    return args


class _Terminated(BaseException):
    """SIGTERM, raised where the command is, so that what it made is cleaned up on the way out."""


def _raise_terminated(signum: int, frame: object) -> None:
    # Once: a second SIGTERM cut the cleanup the first began short (a move's undo, its source
    # left locked for the lease). Ctrl-C still ends it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.command in ("serve", "hash-token"):
        return _run_command(args)
    # timeout(1), systemd and a Job's end stop a command with SIGTERM, whose default action
    # ended it where it stood: the copy `import-store --to` sends left in the temporary
    # directory, a `.partial` export beside its file, a move's lock and held copy left for an
    # operator. Raised as an exception, it unwinds as Ctrl-C does: each step's cleanup runs.
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _run_command(args)
    except _Terminated:
        print(f"sessions-server {args.command}: stopped by SIGTERM before it finished", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:  # past this point nothing is left to clean up: SIGTERM ends the process as usual
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_command(args: argparse.Namespace) -> int:
    if args.command == "move-object":
        return _move_objects(
            args.source,
            args.destination,
            args.object_key,
            args.token,
            replace=args.replace,
            lease_seconds=args.lease_seconds,
            tls=args.tls_config,
            tls_flags=_tls_flags(args),
        )
    if args.command == "abort-move":
        return _abort_moves(
            args.source, args.object_key, args.token, release_hold=args.release_hold, tls=args.tls_config
        )
    if args.command == "hash-token":
        from sessions_server.transport.auth import hash_token

        print(hash_token(args.token))
        return 0
    if args.command == "export-store":
        return _save_store(args.source, args.object_key, args.file, args.token, force=args.force, tls=args.tls_config)
    if args.command == "import-store":
        if args.address:
            return _send_store(
                args.file, args.object_key, args.address, args.token, replace=args.replace, tls=args.tls_config
            )
        data_dir = args.data_dir or Path("./data")
        limits = dataclasses.replace(_text_limits(args), max_assembly_bytes=args.max_assembly_bytes)
        return _import_store(args.file, args.object_key, data_dir, replace=args.replace, limits=limits)
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    problem = _data_dir_problem(args.data_dir)
    if problem is not None:
        print(f"sessions-server: {problem}", file=sys.stderr)
        return 1
    _configure_logging(args.log_level, args.log_format, access_log=getattr(args, "access_log", False))
    for retired in ("subscriber_queue_events", "subscriber_queue_bytes"):
        if getattr(args, retired) is not None:
            logging.getLogger("sessions.server").warning(
                "--%s is no longer used: subscribers read the retained events and fall behind only past "
                "--feed-retain-events / --feed-retain-bytes",
                retired.replace("_", "-"),
            )
    paths.set_message_budget(args.message_memo_bytes)
    packed_cache.set_budget(args.message_memo_bytes // 3)
    config = _server_config(args)
    return _run_on_event_loop(args.event_loop, lambda: _run(config))


def _server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
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
        max_streams_per_connection=args.max_streams_per_connection,
        max_connection_idle_seconds=args.max_connection_idle_seconds,
        max_connection_age_seconds=args.max_connection_age_seconds,
        max_connection_age_grace_seconds=args.max_connection_age_grace_seconds,
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
        probe_listen=args.probe_listen,
        feed=FeedSettings(
            retain_events=args.feed_retain_events,
            retain_bytes=args.feed_retain_bytes,
            retain_total_bytes=args.feed_retain_total_bytes,
        ),
        limits=dataclasses.replace(
            _text_limits(args),
            max_client_message_bytes=args.max_client_message_bytes,
            max_object_bytes=args.max_object_bytes,
            max_subscribers_per_object=args.max_subscribers_per_object,
            max_concurrent_streams=args.max_concurrent_streams,
            max_streams_per_token=args.max_streams_per_token,
            max_assembly_bytes=args.max_assembly_bytes,
        ),
    )


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


def _configure_logging(level: str, log_format: str, *, access_log: bool = False) -> None:
    from sessions_server.transport.metrics import ACCESS_LOGGER, JsonFormatter, RequestIdFilter

    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if access_log:  # its records reach the handler above whatever the root logger's level
        logging.getLogger(ACCESS_LOGGER).setLevel(logging.DEBUG)


def _admin_client(address: str, token: str | None, tls: TlsConfig | None) -> SessionsClient:
    """A client for the admin commands: `--token`, else $SESSIONS_TOKEN."""
    from sessions_client import SessionsClient

    return SessionsClient(address, token=token or os.environ.get("SESSIONS_TOKEN"), tls=tls)


MOVE_LEASE_SECONDS = 600  # sessions_client.admin.MOVE_LEASE_SECONDS, which the client is imported for later


def _lease_seconds(text: str) -> int:
    """--lease-seconds: whole seconds a server takes as a move lock's lease."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if not 1 <= value <= MAX_MOVE_LEASE_SECONDS:
        raise argparse.ArgumentTypeError(f"{value} is not from 1 to {MAX_MOVE_LEASE_SECONDS} seconds")
    return value


def _move_objects(
    source: str,
    destination: str,
    object_keys: list[str],
    token: str | None,
    *,
    replace: bool = False,
    lease_seconds: int = MOVE_LEASE_SECONDS,
    tls: TlsConfig | None = None,
    tls_flags: list[str] | None = None,
) -> int:
    """Moves each key in turn; a key that fails is reported and the others still move, except
    after a failure each of the rest would meet again (`_run_stopper`): they are reported not
    attempted. Exits 1 when any failed, after a summary naming each with its reason."""
    from sessions_client import SessionsError
    from sessions_client.admin import MoveOutcomeUnknown, move_object

    failed: list[tuple[str, str]] = []
    with _admin_client(source, token, tls) as src, _admin_client(destination, token, tls) as dst:
        for index, key in enumerate(object_keys):
            try:
                report = move_object(
                    src, dst, key, destination_name=destination, replace=replace, lease_seconds=lease_seconds
                )
            except MoveOutcomeUnknown as exc:
                failed.append((key, f"outcome unknown: {exc.message}"))
                print(
                    f"sessions-server move-object: {key!r}: outcome unknown: {exc.message}", file=sys.stderr, flush=True
                )
                continue
            except SessionsError as exc:
                reason = _move_failure(source, key, exc, tls_flags or [], tls=tls)
                failed.append((key, reason))
                print(f"sessions-server move-object: {key!r} not moved: {reason}", file=sys.stderr, flush=True)
                stopper = _run_stopper(exc, source, destination)
                if stopper is None:
                    continue
                why, advice = stopper
                rest = object_keys[index + 1 :]
                if rest:
                    print(
                        f"sessions-server move-object: {why}: the other {len(rest)} object(s) are not attempted; "
                        f"{advice}",
                        file=sys.stderr,
                        flush=True,
                    )
                skipped = f"{exc.code.name}: not attempted: {why} for {key!r}"
                failed += [(other, skipped) for other in rest]
                break
            except _Terminated:
                # Undone as a failed move is when the stop came before the delete; after it, or
                # in the undo, what each side holds is for the operator to see.
                print(
                    f"sessions-server move-object: {key!r}: stopped by SIGTERM mid-move; check it on both "
                    f"servers: if {source} refuses it (OBJECT_NOT_OWNED) it moved, and the copy {destination} "
                    f"holds takes writes once released (abort-move --from {destination} --release-hold); if "
                    f"{source} is locked (OBJECT_MOVING), release it (abort-move --from {source}); if "
                    f"{destination} holds a copy while {source} takes writes, move it again with --replace",
                    file=sys.stderr,
                    flush=True,
                )
                raise
            print(
                f"moved {key!r}: {report.size_bytes} bytes, {report.message_rows} messages -> {destination}",
                flush=True,
            )
    if failed:
        moved = len(object_keys) - len(failed)
        unsure = sum(reason.startswith("outcome unknown") for _, reason in failed)
        unknown = f"; {unsure} of the others may have: outcome unknown" if unsure else ""
        print(
            f"sessions-server move-object: {len(failed)} of {len(object_keys)} objects not moved "
            f"({moved} moved{unknown}) from {source} to {destination}:",
            file=sys.stderr,
        )
        for key, reason in failed:
            print(f"  {key!r}: {reason}", file=sys.stderr)
        return 1
    return 0


def _run_stopper(exc: Exception, source: str, destination: str) -> tuple[str, str] | None:
    """Why, and what to do, when every later key of the run would fail as this one did: a
    destination that could not be connected to (each key would wait the 10 s again: hours for a
    re-shard's run to a shard that is down), or one that is moving the object away itself (the
    source by another address, `localhost` for `127.0.0.1`, each key's snapshot taken and sent
    back for nothing)."""
    from sessions_client.admin import DestinationUnreachable

    if isinstance(exc, DestinationUnreachable):
        return f"{destination} could not be connected to", "run this again once it answers"
    if getattr(exc, "reason", None) == "OBJECT_DEPARTING":
        return (
            f"{destination} is moving the object away itself",
            f"check that --to names another server than --from ({source}), not the same one by another address",
        )
    return None


def _move_failure(source: str, key: str, exc: Exception, tls_flags: list[str], *, tls: TlsConfig | None) -> str:
    """One line saying why `key` did not move, and what to do when the operator can act."""
    import shlex

    from sessions_client import SessionsError

    text = _call_failure(exc, tls=tls)
    if isinstance(exc, SessionsError) and exc.reason == "OBJECT_EXISTS":
        return (
            f"{exc.code.name}: the destination already holds this object (a copy an earlier attempt of this "
            "move left, or an object of its own): nothing was changed; check it, then move it again with "
            "--replace to overwrite it"
        )
    if isinstance(exc, SessionsError) and exc.reason == "OBJECT_MOVING":
        command = shlex.join(["sessions-server", "abort-move", "--from", source, f"--object-key={key}", *tls_flags])
        return (
            f"{exc.code.name} [OBJECT_MOVING]: a move of this object is under way or was cut short; "
            f"if none is running, release it with `{command}` and move it again"
        )
    return text


def _call_failure(exc: Exception, *, tls: TlsConfig | None) -> str:
    """A failed call on one line, whatever the server's message holds, with the flags to check
    when the connection failed over TLS settings: a handshake that failed says why (a
    certificate not trusted, or not for the address given; a server speaking plaintext), and a
    connection the server closed without a word is what a plaintext one to a TLS server, or one
    without a client certificate to a server that asks for one, comes to. (Every failed
    connection got the client certificate's hint, a wrong CA and a plaintext server included.)"""
    from sessions_client import SessionsError

    text = " ".join(str(exc).split())
    if not (isinstance(exc, SessionsError) and exc.code.name == "UNAVAILABLE" and "failed to connect" in exc.message):
        return text
    lowered = exc.message.lower()
    if "connection refused" in lowered:  # nothing listening: no TLS matter
        return text
    if "wrong_version_number" in lowered:
        return text + " (the server speaks plaintext: leave out --tls, --tls-ca, --tls-cert and --tls-key)"
    if "certificate_verify_failed" in lowered or "certificate verify failed" in lowered:
        return text + " (the server's certificate is not trusted: give --tls-ca with the CA that issued it)"
    if "hostname verification" in lowered:
        return text + " (the server's certificate does not name the address given: use a name it carries)"
    if "refused the tls handshake" in lowered:  # the client's reading of a connection closed after it
        return text.replace(
            "set TlsConfig's certificate_chain and private_key", "give --tls-cert PEM --tls-key PEM of a CA it trusts"
        )
    if "may speak tls alone" in lowered:  # the client's reading of a plaintext connection closed so
        return text.replace("give the client tls=TlsConfig(...)", "give --tls-ca PEM, or --tls for the system's roots")
    if tls is None:
        return text + " (if the server uses TLS, give --tls-ca PEM, or --tls for the system's roots)"
    if tls.certificate_chain is None:
        return text + " (if the server asks for client certificates, give --tls-cert PEM --tls-key PEM)"
    return text


def _abort_moves(
    source: str, object_keys: list[str], token: str | None, *, release_hold: bool, tls: TlsConfig | None = None
) -> int:
    """Releases the move lock of each key (AbortMove), and with `release_hold` a destination's
    hold on its copy too; exits 1 when a call failed."""
    from sessions_client import SessionsError
    from sessions_client.admin import abort_move
    from sessions_client.admin import release_hold as release

    what = "move lock or hold" if release_hold else "move lock"
    failures = 0
    with _admin_client(source, token, tls) as client:
        for key in object_keys:
            try:
                released = release(client, key) if release_hold else abort_move(client, key)
            except SessionsError as exc:
                failures += 1
                reason = _call_failure(exc, tls=tls)
                print(f"sessions-server abort-move: {key!r} on {source}: {reason}", file=sys.stderr, flush=True)
                continue
            if released:
                print(f"released the {what} of {key!r} on {source}: it takes writes again", flush=True)
            else:
                print(f"{key!r} on {source} held no {what}: nothing to release", flush=True)
    return 1 if failures else 0


def _import_store(source: Path, object_key: str, data_dir: Path, *, replace: bool, limits: Limits) -> int:
    from sessions_server.domain.limits import stored_read_back, stored_text_limits
    from sessions_server.storage.datadir import DataDirectoryInUse, DataDirectoryLock, DataDirectoryNotWritable
    from sessions_server.storage.files import ObjectExists, StoreImportError, import_store_file
    from sessions_server.storage.moved import MovedObjects
    from sessions_server.storage.rows import StorageError

    problem = _data_dir_problem(data_dir)
    if problem is not None:
        print(f"sessions-server import-store: {problem}", file=sys.stderr)
        return 1
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
                read_back=stored_read_back(limits),
            )
            moved.forget(object_key)
        except BaseException:
            if lock.created_data_dir:  # made by this command for an object it did not bring: gone again
                lock.abandon()
            raise
        finally:
            lock.release()
    except DataDirectoryNotWritable as exc:
        print(f"sessions-server import-store: --data-dir {data_dir}: {exc}", file=sys.stderr)
        return 1
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


def _send_store(
    source: Path, object_key: str, address: str, token: str | None, *, replace: bool, tls: TlsConfig | None = None
) -> int:
    from sessions_client import SessionsError
    from sessions_client.admin import import_file

    try:
        with _admin_client(address, token, tls) as client:
            report = import_file(client, object_key, source, replace=replace)
    except (SessionsError, OSError) as exc:
        if isinstance(exc, SessionsError) and exc.reason == "OBJECT_EXISTS":
            reason = (
                f"{exc.code.name} [OBJECT_EXISTS]: {address} already holds object {object_key!r}: nothing was "
                "changed; check it, then import again with --replace to overwrite it"
            )
        else:
            reason = _call_failure(exc, tls=tls)
        print(f"sessions-server import-store: {reason}", file=sys.stderr)
        return 1
    print(f"imported {source} as object {object_key!r} on {address}: {report.message_rows} messages")
    return 0


def _save_store(
    address: str, object_key: str, target: Path, token: str | None, *, force: bool, tls: TlsConfig | None = None
) -> int:
    from sessions_client import SessionsError
    from sessions_client.admin import export_file

    try:
        with _admin_client(address, token, tls) as client:
            report = export_file(client, object_key, target, overwrite=force)
    except FileExistsError:
        print(
            f"sessions-server export-store: {target} exists: nothing was written; pass --force to overwrite it",
            file=sys.stderr,
        )
        return 1
    except (SessionsError, OSError) as exc:
        print(f"sessions-server export-store: {_call_failure(exc, tls=tls)}", file=sys.stderr)
        return 1
    print(
        f"saved object {object_key!r} from {address} to {target}: "
        f"{report.size_bytes} bytes, {report.message_rows} messages"
    )
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
    hurry = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stop_or_hurry(sig: signal.Signals) -> None:
        """The first SIGTERM/SIGINT drains; a second one during the drain stops now."""
        if not stop.is_set():
            stop.set()
        elif not hurry.is_set():
            logging.getLogger("sessions.server").warning(
                "%s again: stopping now, without the rest of the drain (calls in flight are cancelled; "
                "committed writes are on disk)",
                sig.name,
            )
            hurry.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_or_hurry, sig)
    # Until the server runs (`serve` then re-reads the tokens file on it): SIGHUP's default
    # action would end a start half done, its lock and directories left behind.
    loop.add_signal_handler(
        signal.SIGHUP, lambda: logging.getLogger("sessions.server").info("SIGHUP while starting: ignored")
    )
    try:
        await serve(config, stop, on_idle=allocator.release_free_heap if tuned else None, hurry=hurry)
    except (OSError, ValueError) as exc:
        print(f"sessions-server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
