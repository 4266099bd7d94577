"""Runs every ```python block of clients/python/README.md, in order and in one namespace, against
live servers (one plaintext, one with TLS and bearer tokens), and checks each `# ->` comment, so
the client's reference cannot rot: `expr  # -> value` asserts that the expression equals the
value, `name = expr  # -> value` that the name does once the line ran. A checked line that never
runs (inside an `except` that did not fire, say) fails too."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

import sessions_client
from sessions_server.transport.auth import hash_token
from tests.conftest import start_server

README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
CHECKED = re.compile(r"^(?P<indent>\s*)(?P<code>.*?)\s+# -> (?P<expected>.*)$")
PLAIN_ADDRESS, TLS_ADDRESS = "127.0.0.1:50051", "localhost:50443"  # as the README writes them
TOKEN = "s3cret-token"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _self_signed(directory: Path) -> None:
    """ca.pem, a certificate for localhost and 127.0.0.1 that is its own CA, and its key."""
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        cwd=directory,
    )  # fmt: skip


class _Checks:
    def __init__(self) -> None:
        self.expected: set[str] = set()
        self.seen: set[str] = set()
        self.failures: list[str] = []

    def check(self, actual: object, expected: object, where: str) -> None:
        self.seen.add(where)
        if actual != expected:
            self.failures.append(f"{where}\n  expected {expected!r}\n  got      {actual!r}")

    def rewrite(self, block: str, number: int) -> str:
        """The block with each checked line turned into a call of `__check`."""
        lines = []
        for line in block.splitlines():
            checked = CHECKED.match(line)
            if checked is None:
                lines.append(line)
                continue
            indent, code, expected = checked["indent"], checked["code"].strip(), checked["expected"]
            where = f"block {number}: {code}"
            self.expected.add(where)
            statement = ast.parse(code).body[0]
            if isinstance(statement, ast.Expr):
                lines.append(f"{indent}__check(({code}), __expect({expected!r}), {where!r})")
            elif isinstance(statement, ast.Assign):
                lines.append(f"{indent}{code}")
                target = ast.unparse(statement.targets[0])
                lines.append(f"{indent}__check(({target}), __expect({expected!r}), {where!r})")
            else:
                raise AssertionError(f"cannot check {where}")
        return "\n".join(lines) + "\n"


def test_every_readme_example_runs_and_answers_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _self_signed(work)
    tokens = work / "tokens.json"
    grant = {"name": "ops", "sha256": hash_token(TOKEN), "prefixes": [""], "access": "write"}
    tokens.write_text(json.dumps({"tokens": [grant]}))
    plain = start_server(tmp_path / "plain")
    secure = start_server(tmp_path / "secure", tls_cert=work / "ca.pem", tls_key=work / "key.pem", tokens_file=tokens)
    monkeypatch.chdir(work)  # the README opens "ca.pem"
    checks = _Checks()
    exported = {name: getattr(sessions_client, name) for name in sessions_client.__all__}
    namespace: dict[str, Any] = {
        "__check": checks.check,
        "__expect": lambda text: eval(text, dict(exported)),
        "__name__": "__readme__",
    }
    blocks = BLOCK.findall(README.read_text())
    assert len(blocks) >= 10
    try:
        for number, block in enumerate(blocks, 1):
            source = block.replace(PLAIN_ADDRESS, plain.address).replace(
                TLS_ADDRESS, "localhost:" + secure.address.rsplit(":", 1)[1]
            )
            exec(compile(checks.rewrite(source, number), f"<README block {number}>", "exec"), namespace)
    finally:
        for name in ("client", "secure"):
            opened = namespace.get(name)
            if opened is not None and hasattr(opened, "close"):
                opened.close()
        plain.stop()
        secure.stop()
    never = sorted(checks.expected - checks.seen)
    assert not checks.failures and not never, "\n".join(checks.failures + [f"never reached: {w}" for w in never])
    assert len(checks.seen) >= 50
