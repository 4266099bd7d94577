"""The admin commands stopped with SIGTERM (timeout(1), systemd, a Job's end) clean up as they do
on Ctrl-C. SIGTERM's default action ended them where they stood: an import audit found a whole
copy of the file `import-store --to` sends left in the temporary directory (2 GB after one
`timeout`), and `export-store`'s `.partial` file beside its target."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sessions_client import SessionsClient
from tests.e2e.conftest import ServerProcess
from tests.relay import Relay, pass_bytes

GUARD_SECONDS = 60.0


class StallingRelay(Relay):
    """Passes `after` bytes one way (from the server, or to it) on each connection, then holds
    that direction for good; `passed` is set once it holds."""

    def __init__(self, target: str, *, from_server: bool, after: int) -> None:
        self._stalls_from_server = from_server
        self._after = after
        self.passed = threading.Event()
        self._closed = threading.Event()
        super().__init__(target)

    def close(self) -> None:
        self._closed.set()
        super().close()

    def pump(self, source: socket.socket, sink: socket.socket, *, from_server: bool) -> None:
        if pass_bytes(source, sink, self._after if from_server == self._stalls_from_server else None):
            self.passed.set()
            self._closed.wait()


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "the condition never came"
        time.sleep(0.01)


def _stopped(command: subprocess.Popen[str]) -> tuple[int, str]:
    command.send_signal(signal.SIGTERM)
    _, err = command.communicate(timeout=GUARD_SECONDS)
    return command.returncode, err


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    running = ServerProcess(tmp_path / "data").start()
    try:
        with SessionsClient(running.address) as client:
            text = "lorem ipsum " * 5000
            client.object("big").session().append_messages(
                [{"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": text}]} for i in range(100)]
            )
        yield running
    finally:
        running.stop()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sessions_server.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_export_store_stopped_by_sigterm_leaves_no_partial_file(server: ServerProcess, tmp_path: Path) -> None:
    relay = StallingRelay(server.address, from_server=True, after=1024 * 1024)
    out = tmp_path / "out"
    out.mkdir()
    try:
        command = _cli("export-store", str(out / "big.sqlite"), "--object-key", "big", "--from", relay.address)
        _until(lambda: relay.passed.is_set() and any(out.iterdir()))
        code, err = _stopped(command)
    finally:
        relay.close()
    assert code == 128 + signal.SIGTERM, err
    assert err.splitlines()[-1] == "sessions-server export-store: stopped by SIGTERM before it finished"
    assert list(out.iterdir()) == []


def test_import_store_to_a_server_stopped_by_sigterm_leaves_no_copy(server: ServerProcess, tmp_path: Path) -> None:
    with SessionsClient(server.address) as client:
        from sessions_client.admin import export_file

        export_file(client, "big", tmp_path / "big.sqlite")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    relay = StallingRelay(server.address, from_server=False, after=1024 * 1024)
    try:
        command = _cli(
            "import-store",
            str(tmp_path / "big.sqlite"),
            "--object-key",
            "copy",
            "--to",
            relay.address,
            env={**os.environ, "TMPDIR": str(temporary)},
        )
        _until(relay.passed.is_set)
        assert list(temporary.iterdir())  # the copy being sent
        code, err = _stopped(command)
    finally:
        relay.close()
    assert code == 128 + signal.SIGTERM, err
    assert err.splitlines()[-1] == "sessions-server import-store: stopped by SIGTERM before it finished"
    assert list(temporary.iterdir()) == []


def test_move_object_stopped_by_sigterm_mid_copy_is_undone_and_says_what_to_check(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Stopped while the destination receives the copy (the relay holds it midway), the move is
    undone as a failed one is: the source takes writes again and the destination holds nothing.
    A second SIGTERM, sent at once, does not cut that undo short."""
    destination = ServerProcess(tmp_path / "destination").start()
    relay = StallingRelay(destination.address, from_server=False, after=1024 * 1024)
    try:
        command = _cli("move-object", "--from", server.address, "--to", relay.address, "--object-key", "big")
        _until(relay.passed.is_set)
        command.send_signal(signal.SIGTERM)
        code, err = _stopped(command)
        assert code == 128 + signal.SIGTERM, err
        assert "'big': stopped by SIGTERM mid-move; check it on both servers" in err
        with SessionsClient(server.address) as source, SessionsClient(destination.address) as arrived:
            assert (
                source.object("big")
                .session()
                .append_message({"id": "after", "role": "user", "parts": [{"type": "text", "text": "writable"}]})
                .inserted
            )
            assert arrived.object("big").session().get_history() == []
    finally:
        relay.close()
        destination.stop()
