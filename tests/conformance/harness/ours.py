"""Our side: the server as a child process (`sessions-server serve`), so it runs on its own core
beside the test process, with the same reserved metadata keys as the oracle's Sessions."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

RESERVED_KEYS = ("reserved", "channel")
SERVER_BIN = Path(sys.executable).parent / "sessions-server"


def import_store(source: Path, object_key: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`sessions-server import-store FILE --object-key KEY --data-dir DIR`."""
    return subprocess.run(
        [str(SERVER_BIN), "import-store", str(source), "--object-key", object_key, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )


class OurServerProcess:
    def __init__(self, data_dir: Path, log_path: Path) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, timeout: float = 60.0) -> str:
        assert self.proc is None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [str(SERVER_BIN), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(self.data_dir)]
        for key in RESERVED_KEYS:
            args += ["--reserved-metadata-key", key]
        args += self.extra_args()
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode("utf-8", "replace")
            if not line:
                break
            lines.append(line)
            match = re.search(r"listening on (\S+:\d+)", line)
            if match:
                self.address = match.group(1)
                threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
                return self.address
        self.stop()
        raise RuntimeError(
            f"our server did not start: {''.join(lines)}\n{self.log_path.read_text(errors='replace')[-2000:]}"
        )

    def extra_args(self) -> list[str]:
        return []

    @staticmethod
    def _drain(stream: IO[bytes]) -> None:
        for _ in iter(stream.readline, b""):
            pass

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
