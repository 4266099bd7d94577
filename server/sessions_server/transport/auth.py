"""Bearer-token authentication and object-key-prefix authorization.

Tokens live in a JSON file as SHA-256 digests (never in clear), each granting read or write
access to object keys under listed prefixes:

    {"tokens": [{"name": "agent-a", "sha256": "<hex>", "prefixes": ["tenant-a/"], "access": "write"}]}

`access: write` implies read. The file is re-read on SIGHUP. A call is authorized before anything
that could reveal whether an object exists: a missing or unknown token is UNAUTHENTICATED, a
token without a grant for the key (or for writing) is PERMISSION_DENIED, whatever the object.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable
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

    def reload(self) -> None:
        """Re-reads the file; a broken file keeps the previous grants (and is logged)."""
        try:
            self._grants = load_grants(self.path)
            self.generation += 1
            log.warning("reloaded %d token grants from %s", len(self._grants), self.path)
        except ValueError as exc:
            log.error("keeping previous token grants: %s", exc)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Grant:
        """The grant of the call's bearer token; UNAUTHENTICATED without a known one."""
        token = _bearer(metadata)
        if token is None:
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
