"""The server as a subprocess: started from the installed `sessions-server` command, so these
tests exercise the real entry point, signals and restarts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

LISTENING = re.compile(r"listening on (\S+)")


class ServerProcess:
    """A `sessions-server serve` child process bound to 127.0.0.1:0."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.banner = ""  # the line that announced the address
        self.startup: list[str] = []  # what the server wrote before it
        self.launcher: list[str] = []  # a command that runs the server's command line after it

    def start(self) -> ServerProcess:
        command = [sys.executable, "-m", "sessions_server.cli", "serve", "--listen", "127.0.0.1:0"]
        command += ["--data-dir", str(self.data_dir), *self.extra]
        self.proc = subprocess.Popen(
            [*self.launcher, *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ}
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # blocks until the server prints its address (or dies)
            match = LISTENING.search(line)
            if match:
                self.address = match.group(1)
                self.banner = line
                return self
            self.startup.append(line)
        output = "".join(self.startup[-20:])
        raise RuntimeError(f"server exited before listening (code {self.proc.wait()}):\n{output}")

    def signal(self, sig: signal.Signals) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.proc = None
        return code

    def output(self) -> str:
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data").start()
    yield server
    server.stop()
