"""Tokens files for tests of tenants sharing a server: one write token per tenant name, granting
the keys under `tenant-<name>/`, whose secret is `<name>-secret`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sessions_server.transport.auth import hash_token


def tenant_tokens(path: Path, names: Iterable[str]) -> Path:
    """Writes the tokens file at `path` and returns it."""
    grants = [
        {"name": name, "sha256": hash_token(f"{name}-secret"), "prefixes": [f"tenant-{name}/"], "access": "write"}
        for name in names
    ]
    path.write_text(json.dumps({"tokens": grants}))
    return path
