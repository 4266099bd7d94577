"""Bearer-token authentication and object-key-prefix authorization.

Tokens live in a JSON file as SHA-256 digests (never in clear), each granting read or write
access to object keys under listed prefixes:

    {"tokens": [{"name": "agent-a", "sha256": "<hex>", "prefixes": ["tenant-a/"], "access": "write"}]}

`access: write` implies read. The file is re-read on SIGHUP. A call is authorized before anything
that could reveal whether an object exists: a missing or unknown token is UNAUTHENTICATED, a
token without a grant for the key (or for writing) is PERMISSION_DENIED, whatever the object.

Every such refusal is logged at WARNING by `sessions.auth` (`RefusalLog`: the peer, the method,
the code and reason, the refusal's message; never the token), at most one line a minute for each
peer and reason.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sessions_server.domain.errors import PermissionDenied, Unauthenticated

log = logging.getLogger("sessions.auth")
AUTHORIZATION_HEADER = "authorization"


@dataclass(frozen=True)
class Grant:
    """What one token may do."""

    name: str
    digest: str
    prefixes: tuple[str, ...]
    write: bool

    def allows(self, object_key: str, write: bool) -> bool:
        if write and not self.write:
            return False
        return any(object_key.startswith(prefix) for prefix in self.prefixes)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def load_grants(path: Path) -> list[Grant]:
    """Parses a tokens file; raises ValueError naming what is wrong."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read tokens file {path}: {exc}") from None
    entries = document.get("tokens") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f'tokens file {path} needs a top-level "tokens" list')
    grants = []
    for index, entry in enumerate(entries):
        where = f"tokens[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be an object")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or len(digest) != 64:
            raise ValueError(f"{where}.sha256 must be a 64-digit hex SHA-256 of the token")
        prefixes = entry.get("prefixes")
        if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
            raise ValueError(f'{where}.prefixes must be a list of strings ("" grants every key)')
        access = entry.get("access", "read")
        if access not in ("read", "write"):
            raise ValueError(f'{where}.access must be "read" or "write"')
        for prefix in prefixes:
            if prefix[-1:].isalnum():
                # Prefixes match characters, not path segments: a grant for `tenant-a` reaches
                # `tenant-ab/...` too, which a tokens file rarely means.
                log.warning(
                    "%s.prefixes: %r also grants keys such as %r; end it with a separator (e.g. %r) "
                    "unless that is meant",
                    where,
                    prefix,
                    prefix + "b/...",
                    prefix + "/",
                )
        grants.append(Grant(str(entry.get("name", where)), digest.lower(), tuple(prefixes), access == "write"))
    return grants


class TokenAuthority:
    """The grants in force; `check` authorizes one call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._grants = load_grants(path)
        self.generation = 0  # bumped by every reload that took effect: long calls check again
        # Called after each reload that took effect, on the reloading thread: calls that would
        # otherwise learn of it only at their next message (see `open_services.needing_token`).
        self._reload_listeners: set[Callable[[], None]] = set()

    def reload(self) -> None:
        """Re-reads the file; a broken file keeps the previous grants (and is logged)."""
        try:
            self._grants = load_grants(self.path)
            self.generation += 1
            log.info("reloaded %d token grants from %s", len(self._grants), self.path)
        except ValueError as exc:
            log.error("keeping previous token grants: %s", exc)
            return
        for listener in tuple(self._reload_listeners):
            listener()

    def on_reload(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Calls `listener` after every reload that takes effect; returns what stops that."""
        self._reload_listeners.add(listener)
        return functools.partial(self._reload_listeners.discard, listener)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Grant:
        """The grant of the call's bearer token; UNAUTHENTICATED without a known one."""
        metadata = tuple(metadata)
        token = _bearer(metadata)
        if token is None:
            # A header of another form was reported "missing", which sent people looking for why
            # their header did not arrive.
            if any(key == AUTHORIZATION_HEADER for key, _ in metadata):
                raise Unauthenticated(
                    "the authorization metadata holds no bearer token: send `authorization: Bearer <token>`"
                )
            raise Unauthenticated("missing bearer token (metadata `authorization: Bearer <token>`)")
        digest = hash_token(token)
        grant = next((g for g in self._grants if hmac.compare_digest(g.digest, digest)), None)
        if grant is None:
            raise Unauthenticated("unknown bearer token")
        return grant

    def token_id(self, metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
        """What tells the call's token from every other (its digest: names may be shared, or
        move to another token with a reload), None without a known token."""
        try:
            return self.authenticate(metadata).digest
        except Unauthenticated:
            return None

    def check(self, metadata: Iterable[tuple[str, str | bytes]], object_key: str, *, write: bool) -> Grant:
        """Authenticates, then authorizes reading or writing `object_key`."""
        grant = self.authenticate(metadata)
        if not grant.allows(object_key, write):
            action = "write" if write else "read"
            raise PermissionDenied(f"token {grant.name!r} may not {action} this object key")
        return grant

    def check_server_wide(self, metadata: Iterable[tuple[str, str | bytes]], what: str) -> Grant:
        """Authenticates, then authorizes a call about the whole server (`what`, for the
        message), which needs a token granting every key."""
        grant = self.authenticate(metadata)
        if not grant.allows("", False):
            raise PermissionDenied(
                f'{what} needs a token granting every object key (prefix ""); token {grant.name!r} does not'
            )
        return grant


def _bearer(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    for key, value in metadata:
        if key == AUTHORIZATION_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


# How often a refusal is logged for one peer and reason: at most once in this many seconds, the
# next line counting those left out meanwhile (a client with a stale token retries in a loop).
REFUSAL_LOG_SECONDS = 60.0
# Peers and reasons remembered for that: past this many (a scan from many addresses), the
# longest quiet is forgotten, and a refusal from it is logged again when it next comes.
REFUSAL_LOG_PEERS = 1024
# The refusal's message as logged, at most (it names a token's grant, never the token).
REFUSAL_DETAIL_CHARS = 200


def peer_host(peer: str) -> str:
    """gRPC's peer (`ipv4:10.0.0.7:52144`, `ipv6:[::1]:52144`, `unix:/run/s.sock`) without its
    port: a client's reconnections come from ports of their own."""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        address = address.rpartition(":")[0] or address
    return f"{kind}:{address}" if address else kind


@dataclass
class _Window:
    began: float
    left_out: int = 0


class RefusalLog:
    """Logs calls refused by the token check (UNAUTHENTICATED, PERMISSION_DENIED) at WARNING:
    the first of each peer (its address, without the port) and reason in REFUSAL_LOG_SECONDS,
    then the next after that, with the count of those left out between. Never the token: the
    line holds the peer, the method, the code and reason and the refusal's message, which the
    token check words without it. `now` is the clock (tests pass their own)."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()

    def note(self, peer: str, method: str, code: str, reason: str, detail: str) -> None:
        host = peer_host(peer)
        key = (host, reason or code)
        now = self._now()
        window = self._windows.get(key)
        if window is not None and now - window.began < REFUSAL_LOG_SECONDS:
            window.left_out += 1
            return
        left_out = window.left_out if window is not None else 0
        self._windows[key] = _Window(now)
        self._windows.move_to_end(key)
        while len(self._windows) > REFUSAL_LOG_PEERS:
            self._windows.popitem(last=False)
        detail = " ".join(detail.split())[:REFUSAL_DETAIL_CHARS]
        if left_out:
            log.warning(
                "refused %s from %s: %s %s (%s); %d more like it from this peer since its last line were not logged",
                method,
                host,
                code,
                reason or "-",
                detail,
                left_out,
            )
        else:
            log.warning("refused %s from %s: %s %s (%s)", method, host, code, reason or "-", detail)
