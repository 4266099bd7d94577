"""`python -m sessions_server` is the `sessions-server` command.

The TypeScript client's README gave `SESSIONS_SERVER_CMD="python -m sessions_server"`, and the
package had no `__main__`: "No module named sessions_server.__main__". It runs the console
script's own entry (`sessions_server.cli:main`), subcommands and all.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_server import version
from tests.e2e.conftest import LISTENING

SUBCOMMANDS = ("serve", "move-object", "abort-move", "hash-token", "import-store", "export-store")


def _module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessions_server", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_help_names_every_subcommand() -> None:
    done = _module("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sessions-server"), done.stdout
    for command in SUBCOMMANDS:
        assert command in done.stdout, (command, done.stdout)
    assert "Traceback" not in done.stderr


def test_version_is_the_installed_package_s() -> None:
    done = _module("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"sessions-server {version()}"


def test_a_subcommand_runs_as_it_does_through_the_console_script() -> None:
    done = _module("hash-token", "secret")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"  # sha256("secret")


def test_a_bad_flag_is_refused_as_the_console_script_refuses_it() -> None:
    done = _module("serve", "--listen", "nowhere")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "--listen" in done.stderr and "'nowhere'" in done.stderr, done.stderr


def test_serve_runs_the_server_as_the_typescript_tests_start_it(tmp_path: Path) -> None:
    """`SESSIONS_SERVER_CMD="python -m sessions_server"` with `serve --listen 127.0.0.1:0
    --data-dir DIR` after it, as clients/typescript/test/server.ts appends them."""
    command = [sys.executable, "-m", "sessions_server", "serve", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*command, "--data-dir", str(tmp_path / "data")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        address = next((m.group(1) for line in proc.stdout if (m := LISTENING.search(line))), None)
        assert address is not None, f"exited before listening (code {proc.wait(timeout=30)})"
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            serving = health.Check(health_pb2.HealthCheckRequest(), timeout=30).status
            assert serving == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
