"""Server configuration: one frozen record, built from command-line flags or by tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sessions_server.domain.keys import MAX_OBJECT_KEY_BYTES
from sessions_server.domain.limits import Limits
from sessions_server.domain.search import DEFAULT_CONCURRENT_SEARCHES
from sessions_server.storage.feed import FeedSettings
from sessions_server.storage.registry import DEFAULT_MAX_OPEN_OBJECTS

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_WORKER_THREADS = 8
DEFAULT_DRAIN_SECONDS = 10.0
DEFAULT_KEEPALIVE_SECONDS = 60.0
DEFAULT_KEEPALIVE_TIMEOUT_SECONDS = 20.0
DEFAULT_MIN_CLIENT_PING_SECONDS = 10.0


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
    progress_seconds: float = 10.0
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
    idle_seconds: float = 30.0
    search_seconds: float = 2.0
    max_concurrent_searches: int = DEFAULT_CONCURRENT_SEARCHES
    max_query_bytes: int = 4096
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
    feed: FeedSettings = field(default_factory=FeedSettings)
    extra_options: tuple[tuple[str, int], ...] = field(default_factory=tuple)
