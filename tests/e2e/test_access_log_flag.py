"""`--access-log`: a line per call from the `sessions.access` logger, without the rest of the
server's (and gRPC's) debug lines that `--log-level DEBUG` brings."""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

from sessions_client import SessionsClient
from tests.e2e.conftest import ServerProcess
from tests.e2e.test_signals_and_drain import Lines


def test_access_log_flag_logs_each_call_at_the_default_level(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--access-log").start()
    try:
        assert server.proc is not None and server.proc.stdout is not None
        lines = Lines(server.proc.stdout)
        with SessionsClient(server.address) as client:
            session = client.object("logged/key").session()
            session.append_message({"id": "m1", "role": "user", "parts": []})
            session.get_latest_leaf()
        digest = hashlib.sha256(b"logged/key").hexdigest()[:16]
        append = lines.wait_for("SessionService/AppendMessage OK")
        assert f"object={digest}" in append and "logged/key" not in append
        assert "DEBUG sessions.access" in append
        lines.wait_for("SessionService/GetLatestLeaf OK")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
        others = [line for line in lines.text.splitlines() if " DEBUG " in line and "sessions.access" not in line]
        assert others == []  # the level stays WARNING for everything else
    finally:
        server.stop()
