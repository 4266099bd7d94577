"""Helpers for the reliability tests: a server subprocess that can be killed, limited and
watched, raw reads of message JSON, and offline checks of object files (torn rows, attachment
completeness, `PRAGMA integrity_check`).

The server runs as `python -m sessions_server.cli serve` so signals, crashes and resource limits
hit a real process. Its output is drained by a thread (a full pipe would otherwise block the
server) and kept for failure reports.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.paths import FILE_SUFFIX, OBJECTS_DIR

LISTENING = re.compile(r"listening on (\S+)")
POINTER = re.compile(r"attachment:sha256:([0-9a-f]{64})")
START_TIMEOUT_SECONDS = 60.0


def exec_after(setup: str) -> str:
    """Python for `python -c`: runs `setup` (rlimits, signal dispositions: what survives exec),
    then replaces itself with `python <its own arguments>`.

    Used instead of `preexec_fn`, which forces a plain fork of this multi-threaded test process:
    with gRPC channels open here, grpcio's fork handlers can crash that child before it execs
    (grpc/grpc#43055). Without `preexec_fn` the child is spawned without them."""
    return f"import os, sys\n{setup}\nos.execv(sys.executable, [sys.executable, *sys.argv[1:]])"


class ServerDied(RuntimeError):
    """The server process exited before it printed its address."""


class Server:
    """A `sessions-server serve` child bound to 127.0.0.1:0 on `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        setup: str = "",
    ) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.setup = setup
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Server:
        command = [sys.executable, "-m", "sessions_server.cli", "serve", "--listen", "127.0.0.1:0"]
        command += ["--data-dir", str(self.data_dir), *self.extra]
        if self.setup:
            command = [sys.executable, "-c", exec_after(self.setup), *command[1:]]
        self.lines = []
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={**os.environ},
        )
        found = threading.Event()

        def drain() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if not found.is_set():
                    match = LISTENING.search(line)
                    if match:
                        self.address = match.group(1)
                        found.set()

        self._reader = threading.Thread(target=drain, name="server-output", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._reader.join(timeout=5)
                code = self.proc.poll()
                self.kill()
                raise ServerDied(f"server did not start (exit {code}):\n{self.output()}")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> int | None:
        """SIGKILL (no chance to flush or checkpoint); returns the exit status."""
        return self.signal(signal.SIGKILL)

    def signal(self, sig: signal.Signals, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.proc = None
        return code

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.proc is not None:
            self.kill()


def health_status(address: str, timeout: float = 5.0) -> int:
    """The overall health status (health_pb2.HealthCheckResponse.ServingStatus)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout).status


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def routing(object_key: str) -> tuple[tuple[str, str], ...]:
    import urllib.parse

    return (("x-object-key", urllib.parse.quote(object_key, safe="")),)


def stored_json(
    stub: pb_grpc.SessionServiceStub, object_key: str, session_id: str, message_id: str, timeout: float = 60.0
) -> str | None:
    """The JSON text GetMessage returns (pieces joined, payloads restored), or None if absent."""
    request = pb.GetMessageRequest(object_key=object_key, session_id=session_id, message_id=message_id)
    pieces = [r.frame.json for r in stub.GetMessage(request, metadata=routing(object_key), timeout=timeout)]
    return "".join(pieces) if pieces else None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def canonical(message: dict[str, Any]) -> str:
    """Compact JSON; with ASCII-only string fields this is exactly what the server stores."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# ── offline checks of object files ───────────────────────────────────────────


def object_files(data_dir: Path) -> list[Path]:
    root = data_dir / OBJECTS_DIR
    return sorted(root.glob(f"*/*/*{FILE_SUFFIX}")) if root.exists() else []


@contextlib.contextmanager
def open_file(path: Path, *, readonly: bool = True) -> Iterator[sqlite3.Connection]:
    """A connection of our own to an object file. Read-only for live servers; a writable one
    (used when no server runs) also performs WAL recovery the way a restarted server would."""
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=30)
    else:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        yield conn
    finally:
        conn.close()


@dataclass
class FileReport:
    """What is wrong with one object file (empty lists: nothing)."""

    path: Path
    integrity: str = "ok"
    torn: list[str] = field(default_factory=list)
    messages: int = 0
    continuation_rows: int = 0
    attachments: int = 0


def check_object_file(path: Path, *, readonly: bool = True, integrity: bool = True, parents: bool = True) -> FileReport:
    """Integrity check plus the invariants a torn write would break:

    - a message row with content_chunks = n has chunk rows idx exactly 1..n, no chunk row lacks
      its message row, and the joined content is a JSON message with the row's id and role;
    - every attachment meta row has chunk rows idx exactly 0..chunks-1 whose bytes add up to
      `bytes` and hash to its address; no chunk row lacks its meta row;
    - every attachment reference names a complete payload, and every pointer inside a message's
      content has a reference and a payload;
    - with `parents`, every non-null parent_id names a row of the same session (appends resolve
      parents and deletes re-parent children; only ImportMessages stores parents verbatim).
    """
    report = FileReport(path)
    with open_file(path, readonly=readonly) as conn:
        if integrity:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
            report.integrity = "ok" if rows == ["ok"] else "; ".join(rows[:5])
        chunks: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for session_id, message_id, idx, content in conn.execute(
            "SELECT session_id, id, idx, content FROM cf_agents_session_message_chunks ORDER BY session_id, id, idx"
        ):
            chunks.setdefault((session_id, message_id), []).append((idx, content))
            report.continuation_rows += 1
        ids: set[tuple[str, str]] = set()
        linked: list[tuple[str, str, str]] = []
        refs: set[tuple[str, str, str]] = {
            (s, m, h)
            for s, m, h in conn.execute("SELECT session_id, message_id, hash FROM cf_agents_session_attachment_refs")
        }
        meta = {
            h: (int(b), int(n))
            for h, b, n in conn.execute("SELECT hash, bytes, chunks FROM cf_agents_session_attachment_meta")
        }
        payload_chunks: dict[str, list[tuple[int, bytes]]] = {}
        for h, idx, data in conn.execute(
            "SELECT hash, idx, data FROM cf_agents_session_attachment_chunks ORDER BY hash, idx"
        ):
            payload_chunks.setdefault(h, []).append((int(idx), bytes(data)))
        for session_id, message_id, role, parent_id, content, content_chunks in conn.execute(
            "SELECT session_id, id, role, parent_id, content, content_chunks FROM cf_agents_session_messages"
        ):
            report.messages += 1
            where = f"{path.name} session {session_id!r} message {message_id!r}"
            ids.add((session_id, message_id))
            if parent_id is not None and parents:
                linked.append((session_id, message_id, parent_id))
            got = chunks.pop((session_id, message_id), [])
            if [idx for idx, _ in got] != list(range(1, int(content_chunks) + 1)):
                report.torn.append(f"{where}: content_chunks={content_chunks} but chunk rows {[idx for idx, _ in got]}")
                continue
            text = content + "".join(c for _, c in got)
            try:
                value = json.loads(text)
            except ValueError as exc:
                report.torn.append(f"{where}: stored content is not JSON ({exc})")
                continue
            if not isinstance(value, dict) or value.get("id") != message_id or value.get("role") != role:
                report.torn.append(f"{where}: stored content does not match the row's id/role")
            for pointer in set(POINTER.findall(text)):
                if (session_id, message_id, pointer) not in refs:
                    report.torn.append(f"{where}: pointer {pointer[:12]} has no reference row")
                if pointer not in meta:
                    report.torn.append(f"{where}: pointer {pointer[:12]} has no payload")
        for (session_id, message_id), got in chunks.items():
            indexes = [i for i, _ in got]
            report.torn.append(
                f"{path.name} session {session_id!r}: chunk rows {indexes} of missing message {message_id!r}"
            )
        for session_id, message_id, parent_id in linked:
            if (session_id, parent_id) not in ids:
                report.torn.append(
                    f"{path.name} session {session_id!r} message {message_id!r}: parent {parent_id!r} does not exist"
                )
        for session_id, message_id, h in refs:
            if h not in meta:
                report.torn.append(f"{path.name} {session_id!r}/{message_id!r}: reference to missing payload {h[:12]}")
        for h, (size, count) in meta.items():
            report.attachments += 1
            got_payload = payload_chunks.pop(h, [])
            if [idx for idx, _ in got_payload] != list(range(count)):
                report.torn.append(
                    f"{path.name} payload {h[:12]}: chunks={count} but chunk rows {[i for i, _ in got_payload]}"
                )
                continue
            data = b"".join(d for _, d in got_payload)
            if len(data) != size or hashlib.sha256(data).hexdigest() != h:
                report.torn.append(f"{path.name} payload {h[:12]}: {len(data)} bytes do not match its meta/hash")
        for h in payload_chunks:
            report.torn.append(f"{path.name} payload chunk rows of {h[:12]} without a meta row")
    return report


def table_dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of an object file, sorted, read through a read-only connection."""
    with open_file(path) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        dump: dict[str, list[tuple[Any, ...]]] = {}
        for table in tables:
            try:
                rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()
            except sqlite3.DatabaseError:  # virtual tables whose module is unavailable here
                continue
            dump[table] = sorted(rows, key=repr)
    return dump


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Polls `condition` until true or the deadline passes; returns the last result."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


@contextlib.contextmanager
def closed_file_locked(path: Path, guard_seconds: float = 20.0) -> Iterator[None]:
    """Another process's exclusive lock on an object file the server has closed (a backup's, a
    replicator's): the server's next open of it waits until the block ends. Waits for the
    server's own connections to let go of the file first (an eviction closes them)."""
    holder: list[sqlite3.Connection] = []

    def take() -> bool:
        conn = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            conn.execute("BEGIN EXCLUSIVE")
            conn.execute("CREATE TABLE IF NOT EXISTS test_lock_holder (x)")  # rolled back
        except sqlite3.OperationalError:
            conn.close()
            return False
        holder.append(conn)
        return True

    assert wait_until(take, guard_seconds, interval=0.005), f"no exclusive lock on {path.name} within the guard"
    try:
        yield
    finally:
        holder[0].execute("ROLLBACK")
        holder[0].close()
