"""The upstream side: a stdlib HTTP client for the oracle (tests/conformance/oracle) and a launcher
that runs it as a child process with its own persist directory.

The oracle is upstream `agents/sessions` (agents@0.32.0) inside a SQLite-backed Durable Object under
local workerd (Miniflare). `POST /obj/:key/:session/:op` with a JSON body answers
`{"ok": true, "result": ...}` or HTTP 500 `{"ok": false, "error": ...}`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

ORACLE_DIR = Path(__file__).resolve().parent.parent / "oracle"
DO_CLASS_DIR = "-SessionsObject"  # Miniflare's folder for the SessionsObject class under the persist dir
RAW_SLOT = "__raw_message_slot__"


class OracleError(RuntimeError):
    """An op that threw inside the Durable Object (upstream's error message)."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class RawJson:
    """JSON text to splice verbatim into a request body (exact numbers, escapes, key order)."""

    def __init__(self, text: str) -> None:
        self.text = text


def encode_body(body: dict[str, Any]) -> bytes:
    """JSON-encodes `body`; RawJson values are spliced in byte for byte."""
    raws: list[str] = []

    def default(value: object) -> object:
        if isinstance(value, RawJson):
            raws.append(value.text)
            return f"{RAW_SLOT}{len(raws) - 1}"
        raise TypeError(f"not JSON serializable: {type(value).__name__}")

    text = json.dumps(body, default=default, ensure_ascii=True, separators=(",", ":"))
    for index, raw in enumerate(raws):
        text = text.replace(json.dumps(f"{RAW_SLOT}{index}"), raw, 1)
    return text.encode("utf-8", "surrogatepass")


class Oracle:
    """Client for one oracle process. Keeps one HTTP connection per thread."""

    def __init__(self, host: str, port: int, timeout: float = 300.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._local = threading.local()

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def _request(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        for attempt in range(2):
            conn = self._connection()
            try:
                headers = {"content-type": "application/json"} if data is not None else {}
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def call(self, key: str, session: str, op: str, body: dict[str, Any] | None = None) -> Any:
        sid = "-" if session == "" else session
        path = f"/obj/{urllib.parse.quote(key, safe='')}/{urllib.parse.quote(sid, safe='')}/{op}"
        status, raw = self._request("POST", path, encode_body(body or {}))
        try:
            payload = json.loads(raw.decode("utf-8"))
        except ValueError as exc:
            raise OracleError(f"non-JSON oracle reply ({status}): {raw[:300]!r}") from exc
        if not payload.get("ok"):
            raise OracleError(str(payload.get("error", "unknown error")), payload.get("name"))
        return payload.get("result")

    def batch(self, key: str, calls: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Runs (session, op, body) calls in order in one request; [(ok, result or OracleError)]."""
        body = {"calls": [{"session": s, "op": op, "body": b} for s, op, b in calls]}
        out: list[tuple[bool, Any]] = []
        for item in self.call(key, "", "batch", body):
            if item.get("ok"):
                out.append((True, item.get("result")))
            else:
                out.append((False, OracleError(str(item.get("error")), item.get("name"))))
        return out

    def healthy(self) -> bool:
        try:
            status, _ = self._request("GET", "/health", None)
            return status == 200
        except OSError:
            return False

    def sql(self, key: str, query: str) -> list[dict[str, Any]]:
        return self.call(key, "", "sql", {"query": query})  # type: ignore[no-any-return]


class OracleProcess:
    """`node serve.mjs` with a persist directory; started and stopped (SIGTERM to its own PID) here."""

    def __init__(self, persist_dir: Path, log_path: Path, bundle_dir: Path | None = None) -> None:
        self.persist_dir = persist_dir
        self.log_path = log_path
        # The worker bundle (wrangler --dry-run output); per run, so concurrent runs never share it.
        self.bundle_dir = bundle_dir or persist_dir.parent / "bundle"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Oracle | None = None
        self._files: dict[str, str] = {}

    @property
    def bundled(self) -> bool:
        return (self.bundle_dir / "worker.js").exists()

    # ── lifecycle ───────────────────────────────────────────────────────────

    def start(self, timeout: float = 90.0) -> Oracle:
        assert self.proc is None, "oracle already running"
        self.persist_dir.mkdir(parents=True, exist_ok=True)
        args = [shutil.which("node") or "node", "serve.mjs", "--port", "0", "--persist", str(self.persist_dir)]
        args += ["--bundle-dir", str(self.bundle_dir)]
        if self.bundled:
            args.append("--no-bundle")
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        env = {**os.environ, "WRANGLER_SEND_METRICS": "false", "CI": "true"}
        # A process group of its own: a node that ignores SIGTERM is killed with its workerd.
        self.proc = subprocess.Popen(
            args,
            cwd=ORACLE_DIR,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        port: int | None = None
        lines: list[str] = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode("utf-8", "replace")
            if not line:
                break
            lines.append(line)
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        if port is None:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"oracle did not start: {''.join(lines)}\n{tail}")
        # Drain further stdout so the child never blocks on a full pipe.
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
        client = Oracle("127.0.0.1", port)
        while time.monotonic() < deadline:
            if client.healthy():
                self.client = client
                return client
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("oracle /health never answered")

    @staticmethod
    def _drain(stream: Any) -> None:
        for _ in iter(stream.readline, b""):
            pass

    def stop(self) -> None:
        """SIGTERM to the PID started here (Miniflare disposes workerd), then wait; after 30 s,
        SIGKILL to its whole group (killing node alone left workerd running)."""
        proc, self.proc, self.client = self.proc, None, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # the whole group ended meanwhile
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def restart(self) -> Oracle:
        self.stop()
        return self.start()

    # ── the objects' files ──────────────────────────────────────────────────

    @property
    def objects_dir(self) -> Path:
        return self.persist_dir / DO_CLASS_DIR

    def object_file(self, key: str) -> Path:
        """The SQLite file of object `key` (named by its Durable Object id; `ping` reports it and
        creates the object if it did not exist)."""
        name = self._files.get(key)
        if name is None:
            assert self.client is not None, "oracle not running"
            name = f"{self.client.call(key, '', 'ping')['id']}.sqlite"
            self._files[key] = name
        return self.objects_dir / name

    def snapshot_file(self, key: str, dest: Path) -> Path:
        """A consistent copy of a live object's file (sqlite3 backup API; WAL content included)."""
        src = sqlite3.connect(f"file:{self.object_file(key)}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(dest)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
        return dest

    def replace_file(self, key: str, source: Path) -> None:
        """Puts `source` in place of object `key`'s file. The oracle must be stopped."""
        assert self.proc is None, "stop the oracle before replacing a file"
        target = self.objects_dir / self._files[key]
        for suffix in ("-wal", "-shm"):
            Path(str(target) + suffix).unlink(missing_ok=True)
        shutil.copyfile(source, target)
