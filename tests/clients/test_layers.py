"""The layers keep to their places: domain imports neither gRPC nor sqlite3, storage never imports
gRPC, transport never builds SQL (it imports no sqlite3) and calls the domain, not storage; the
server's assembly (`transport/server.py`, which opens the data directory and makes the registry
the domain runs on) is the one place that names every layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "sessions_server"
FORBIDDEN = {
    "domain": {"grpc", "sqlite3", "sessions_proto"},
    "storage": {"grpc", "sessions_proto", "sessions_server.transport", "sessions_server.domain"},
    "transport": {"sqlite3", "sessions_server.storage"},
}
ASSEMBLY = {("transport", "server.py")}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports(layer: str) -> None:
    bad = []
    for path in sorted((PACKAGE / layer).glob("*.py")):
        for name in _imports(path):
            if (layer, path.name) in ASSEMBLY and name.startswith("sessions_server.storage"):
                continue
            if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer]):
                bad.append(f"{path.name} imports {name}")
    assert not bad, bad
