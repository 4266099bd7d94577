"""Server configuration: one frozen record, built from command-line flags or by tests."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from sessions_server.domain.keys import MAX_OBJECT_KEY_BYTES
from sessions_server.domain.limits import Limits
from sessions_server.domain.search import DEFAULT_CONCURRENT_SEARCHES, DEFAULT_SEARCH_SECONDS, MAX_QUERY_BYTES
from sessions_server.storage.feed import FeedSettings
from sessions_server.storage.registry import DEFAULT_MAX_OPEN_OBJECTS
from sessions_server.transport.servicer import DEFAULT_PROGRESS_SECONDS

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_WORKER_THREADS = 8
DEFAULT_DRAIN_SECONDS = 10.0
DEFAULT_KEEPALIVE_SECONDS = 60.0
DEFAULT_KEEPALIVE_TIMEOUT_SECONDS = 20.0
DEFAULT_MIN_CLIENT_PING_SECONDS = 10.0
# HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); gRPC's
# default is none. Unbounded, one client resetting every stream it opened as it opened it
# (CVE-2023-44487, "rapid reset": about 50,000 a second) took the server to 870 MB and other
# clients' calls were cancelled; at 2,048 none was, and the server stayed under 150 MB. Above
# the per-token stream share (1,024), so a client at its share still makes unary calls.
DEFAULT_MAX_STREAMS_PER_CONNECTION = 2048
# A connection without a call for this long is closed (GOAWAY; the client reconnects at its next
# call): connections that answered pings and did nothing else were otherwise kept for good, and
# one client holding 20,700 of them took every file descriptor of the server.
DEFAULT_MAX_CONNECTION_IDLE_SECONDS = 300.0
# With a maximum connection age, the calls still open on a connection past it get this long to
# finish before the connection closes under them (a change feed, which never finishes, then
# resumes on a new connection): gRPC's default grace is forever, which would let a subscribed
# client keep a connection, and the certificate it was let in with, for good.
DEFAULT_MAX_CONNECTION_AGE_GRACE_SECONDS = 60.0
MAX_PORT = 65535

_PORT = re.compile(r"[0-9]{1,5}")
_HOSTNAME_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def split_host_port(address: str) -> tuple[str, int]:
    """The host and port of a HOST:PORT address: HOST an IPv4 address, an IPv6 address in
    brackets or a hostname, PORT from 0 to 65535. Raises ValueError saying what is wrong.

    gRPC takes almost anything here and fails late or quietly: a missing port became 443, a
    port past 65535 wrapped around to another one, and text that is no address was reported as
    a refusal of plaintext.
    """
    host, colon, port_text = address.rpartition(":")
    if not colon or (address.startswith("[") and address.endswith("]")):
        raise ValueError("the port is missing")
    if not _PORT.fullmatch(port_text) or int(port_text) > MAX_PORT:
        raise ValueError(f"the port {port_text!r} is not a number from 0 to {MAX_PORT}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError("an IPv6 address goes in brackets, as [::1]:PORT")
    elif not host:
        raise ValueError("the host is missing (0.0.0.0 or [::] binds every interface)")
    elif host.rsplit(".", 1)[-1].isdecimal():  # no hostname ends in a number: an IPv4 address
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host} is not an IPv4 address") from None
    elif len(host) > 253 or not all(_HOSTNAME_LABEL.fullmatch(label) for label in host.split(".")):
        raise ValueError(f"{host!r} is neither an IP address nor a hostname")
    return host, int(port_text)


@dataclass(frozen=True)
class ServerConfig:
    """Everything a server needs to start. Each limit carries its unit in its name."""

    data_dir: Path = Path("./data")
    listen: str = DEFAULT_LISTEN
    reserved_metadata_keys: tuple[str, ...] = ()
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_open_objects: int = DEFAULT_MAX_OPEN_OBJECTS
    max_object_key_bytes: int = MAX_OBJECT_KEY_BYTES
    worker_threads: int = DEFAULT_WORKER_THREADS
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    progress_seconds: float = DEFAULT_PROGRESS_SECONDS
    # The server pings each connection after this long without hearing from it, and closes it
    # when no answer comes within the timeout: calls of a vanished client (a Subscribe holding
    # one of the object's subscriber slots, a stream stalled on flow control) end in about
    # a minute instead of when TCP gives up (15 minutes or more).
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
    keepalive_timeout_seconds: float = DEFAULT_KEEPALIVE_TIMEOUT_SECONDS
    # Clients' own keepalive pings are accepted this often, with or without calls in flight.
    # gRPC's default (5 minutes, calls required) answers a client keepalive of 30 s with a
    # GOAWAY (too_many_pings) that fails the calls in flight.
    min_client_ping_seconds: float = DEFAULT_MIN_CLIENT_PING_SECONDS
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    max_connection_idle_seconds: float = DEFAULT_MAX_CONNECTION_IDLE_SECONDS  # 0: never closed
    # A connection this old is asked to go (GOAWAY: its client reconnects for new calls); 0: never.
    max_connection_age_seconds: float = 0.0
    max_connection_age_grace_seconds: float = DEFAULT_MAX_CONNECTION_AGE_GRACE_SECONDS
    idle_seconds: float = 30.0
    search_seconds: float = DEFAULT_SEARCH_SECONDS
    max_concurrent_searches: int = DEFAULT_CONCURRENT_SEARCHES
    max_query_bytes: int = MAX_QUERY_BYTES
    summarizer_url: str | None = None
    summarizer_model: str = "gpt-4o-mini"
    summarizer_api_key_env: str = "SESSIONS_SUMMARIZER_API_KEY"
    summarizer_timeout_seconds: float = 60.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    allow_plaintext: bool = False
    tokens_file: Path | None = None
    auth_protect_reflection: bool = False
    limits: Limits = field(default_factory=Limits)
    ring_file: Path | None = None
    # Refuse object calls without x-object-key metadata (a shard: its proxy routes by it). Always
    # on with `ring_file`.
    require_routing_header: bool = False
    metrics_listen: str | None = None
    # Health alone, on a port of its own with small requests; with tokens, health on `listen`
    # then needs one.
    probe_listen: str | None = None
    feed: FeedSettings = field(default_factory=FeedSettings)
    extra_options: tuple[tuple[str, int], ...] = field(default_factory=tuple)
