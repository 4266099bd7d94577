"""Shared pieces of the benchmarks: processes (the server, the echo baseline, the upstream oracle),
RSS sampling, message builders, statistics, raw-SQLite baselines and table printing.

Everything here runs on loopback only and stops what it starts (by its own PID).
"""

# ruff: noqa: E501  (result tables are printed as long Markdown rows)

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
for extra in (ROOT / "server", ROOT / "clients" / "python", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

MIB = 1024 * 1024

# ── statistics ───────────────────────────────────────────────────────────────


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100.0 * (len(ordered) - 1))))
    return float(ordered[index])


def ms(seconds: float) -> float:
    return seconds * 1000.0


# ── messages ─────────────────────────────────────────────────────────────────

_WORDS: list[str] | None = None


def vocabulary() -> list[str]:
    """A deterministic vocabulary of 5,000 pronounceable words (Zipf-ish use below)."""
    global _WORDS
    if _WORDS is None:
        rng = random.Random(7)
        consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
        seen: set[str] = set()
        words: list[str] = []
        while len(words) < 5000:
            syllables = rng.randint(1, 4)
            word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables))
            if word not in seen:
                seen.add(word)
                words.append(word)
        _WORDS = words
    return _WORDS


def text_of(size: int, rng: random.Random) -> str:
    """About `size` characters of ASCII words, Zipf-distributed over the vocabulary."""
    words = vocabulary()
    out: list[str] = []
    length = 0
    while length < size:
        # Zipf-like: low ranks far more frequent; rank 0..4999
        rank = min(len(words) - 1, int(rng.paretovariate(1.1)) - 1)
        word = words[rank if rng.random() < 0.7 else rng.randrange(len(words))]
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


class MessageFactory:
    """~`size`-byte UIMessage JSON texts with ids `prefix` + zero-padded counter (id order = seq
    order, so raw SQL range scans read exactly the streamed rows). Texts come from a pool, each
    message with a unique marker word, so building 100,000 stays cheap."""

    def __init__(self, size: int = 1024, prefix: str = "m", pool: int = 512, seed: int = 1) -> None:
        rng = random.Random(seed)
        overhead = len(
            json.dumps({"id": f"{prefix}0000000", "role": "assistant", "parts": [{"type": "text", "text": ""}]})
        )
        body = max(16, size - overhead - 12)
        self.texts = [text_of(body, rng) for _ in range(pool)]
        self.prefix = prefix
        self.count = 0

    def ident(self, index: int) -> str:
        return f"{self.prefix}{index:07d}"

    def json(self, index: int | None = None) -> str:
        if index is None:
            index = self.count
            self.count += 1
        role = "user" if index % 2 == 0 else "assistant"
        text = f"{self.texts[index % len(self.texts)]} u{index:07d}"
        return json.dumps(
            {"id": self.ident(index), "role": role, "parts": [{"type": "text", "text": text}]},
            separators=(",", ":"),
        )

    def batch(self, count: int) -> list[str]:
        return [self.json() for _ in range(count)]


def big_message_json(ident: str, size: int) -> str:
    chunk = "lorem ipsum dolor sit amet consectetur adipiscing elit "
    text = (chunk * (size // len(chunk) + 1))[:size]
    return json.dumps({"id": ident, "role": "user", "parts": [{"type": "text", "text": text}]}, separators=(",", ":"))


# ── processes ────────────────────────────────────────────────────────────────


def _wait_for_line(proc: subprocess.Popen[bytes], pattern: str, timeout: float, what: str) -> re.Match[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    result: list[re.Match[str]] = []

    def reader() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            if not result:
                seen.append(line)
                match = re.search(pattern, line)
                if match:
                    result.append(match)
        # keeps draining until EOF so the child never blocks on a full pipe

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    while time.monotonic() < deadline and not result:
        if proc.poll() is not None and not result:
            time.sleep(0.1)
            if not result:
                break
        time.sleep(0.02)
    if not result:
        raise RuntimeError(f"{what} did not start: {''.join(seen)[-2000:]}")
    return result[0]


class ChildProcess:
    """A child started here; stopped with SIGTERM to its own PID (then SIGKILL)."""

    proc: subprocess.Popen[bytes] | None = None
    name = "child"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess(ChildProcess):
    """`sessions-server serve --listen 127.0.0.1:0 --data-dir DIR [extra]` as a subprocess."""

    name = "sessions-server"

    def __init__(self, data_dir: Path, extra: Sequence[str] = (), log_path: Path | None = None) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable,
            "-m",
            "sessions_server.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
            *extra,
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "server"), str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH", "")]
            ),
        }
        log = open(log_path or (data_dir.parent / f"{data_dir.name}.server.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env, cwd=ROOT
        )
        log.close()
        match = _wait_for_line(self.proc, r"listening on (\S+:\d+)", 60, "sessions-server")
        self.address = match.group(1)


class EchoProcess(ChildProcess):
    """The bare gRPC echo baseline (bench/echo_server.py) as a subprocess."""

    name = "echo"

    def __init__(self, commit_file: Path | None = None) -> None:
        args = [sys.executable, str(BENCH_DIR / "echo_server.py"), "--listen", "127.0.0.1:0"]
        if commit_file is not None:
            args += ["--commit-file", str(commit_file)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        match = _wait_for_line(self.proc, r"listening on (\S+:\d+)", 30, "echo server")
        self.address = match.group(1)


# ── RSS of a process ─────────────────────────────────────────────────────────


def read_status_kib(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


def reset_peak_rss(pid: int) -> bool:
    """Resets VmHWM to the current RSS (Linux clear_refs 5); False when not permitted."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def file_is_open(pid: int, path: Path) -> bool:
    """True when process `pid` holds `path` (or its -wal/-shm) open: tells a hibernated object."""
    prefix = str(path)
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            if os.readlink(f"{fd_dir}/{fd}").startswith(prefix):
                return True
    return False


def hibernate(pid: int, path: Path, touch: Callable[[], None], rounds: int = 50) -> bool:
    """Calls `touch` (requests to other objects, past the server's --max-open-objects) until the
    server has closed `path`; False if it never did. Eviction skips objects still in use, and a
    cancelled stream may hold its object for a moment, so one round is not always enough."""
    for _ in range(rounds):
        touch()
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            if not file_is_open(pid, path):
                return True
            time.sleep(0.005)
    return False


class RssSampler:
    """Samples VmRSS (and VmHWM) of `pid` every `interval` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.hwm_kib = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = read_status_kib(self.pid)
            except OSError:
                return
            self.peak_kib = max(self.peak_kib, status.get("VmRSS", 0))
            self.hwm_kib = max(self.hwm_kib, status.get("VmHWM", 0))
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            status = read_status_kib(self.pid)
            self.peak_kib = max(self.peak_kib, status.get("VmRSS", 0))
            self.hwm_kib = max(self.hwm_kib, status.get("VmHWM", 0))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """Accumulates a process's CPU seconds over the `with` blocks it is used in: less sensitive
    to other load on the machine than wall-clock rates."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += cpu_seconds(self.pid) - self._start


# ── profiling (py-spy, optional) ─────────────────────────────────────────────


class Profiler:
    """`py-spy record` attached to a PID for the duration of a `with` block; writes the raw
    (collapsed) stacks and returns a summary of the hottest functions. No-op when py-spy is
    missing or the profile directory is None."""

    def __init__(self, pid: int, out_dir: Path | None, name: str, rate: int = 250) -> None:
        self.pid, self.out_dir, self.name, self.rate = pid, out_dir, name, rate
        self.proc: subprocess.Popen[bytes] | None = None
        self.path: Path | None = None
        self.summary: dict[str, Any] | None = None

    @staticmethod
    def executable() -> str | None:
        candidate = Path(sys.executable).with_name("py-spy")
        return str(candidate) if candidate.exists() else shutil.which("py-spy")

    def __enter__(self) -> Profiler:
        spy = self.executable()
        if self.out_dir is None or spy is None:
            return self
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / f"{self.name}.txt"
        self.proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(self.pid),
                "--rate",
                str(self.rate),
                "--format",
                "raw",
                "--threads",
                "--output",
                str(self.path),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # attach before the workload starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.path is not None and self.path.exists():
            self.summary = summarize_collapsed(self.path)


_IDLE_LEAVES = (
    "select (selectors.py",
    "poll (selectors.py",
    "epoll_wait",
    "wait (threading.py",
    "get (queue.py",
    "_worker (concurrent/futures/thread.py",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
)
_BOILERPLATE = (
    "<frozen runpy>",
    "asyncio/runners.py",
    "asyncio/base_events.py",
    "asyncio/events.py",
    "threading.py",
    "concurrent/futures/thread.py",
    "cli.py",
    "(libc.so",
    "thread_run (",
    "task_step",
)


def summarize_collapsed(path: Path, top: int = 15) -> dict[str, Any]:
    """Self and inclusive shares of functions across busy samples of a py-spy raw profile.
    Samples whose leaf is a wait (selector, condition, queue) count as idle. Inclusive shares
    list only the project's, gRPC's and SQLite's frames (not the event loop or thread plumbing)."""
    self_counts: dict[str, int] = {}
    incl_counts: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    idle = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        frames = stack.split(";")
        leaf = frames[-1] if frames else "?"
        poller = "_poll_wrapper" in frames[0] and leaf.startswith("Thread.run (")  # gRPC's poller, in C
        if "(idle)" in stack or poller or any(p in leaf for p in _IDLE_LEAVES) or "_queue_SimpleQueue_get" in stack:
            idle += count
            continue
        total += count
        thread = frames[0] if frames else "?"
        threads[thread] = threads.get(thread, 0) + count
        self_counts[leaf] = self_counts.get(leaf, 0) + count
        for frame in set(frames[1:]):
            if any(b in frame for b in _BOILERPLATE):
                continue
            incl_counts[frame] = incl_counts.get(frame, 0) + count

    def share(counts: dict[str, int]) -> list[tuple[str, float]]:
        ordered = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100.0 * c / total, 1)) for name, c in ordered] if total else []

    return {
        "busy_samples": total,
        "idle_samples": idle,
        "threads": share(threads),
        "self": share(self_counts),
        "inclusive": share(incl_counts),
    }


def format_profile(summary: dict[str, Any] | None, top: int = 8) -> str:
    if not summary or not summary.get("busy_samples"):
        return "    (no profile)"
    lines = [f"    busy samples {summary['busy_samples']} (idle {summary['idle_samples']})"]
    lines.append("    threads: " + ", ".join(f"{n} {p}%" for n, p in summary["threads"][:4]))
    lines.append("    self:")
    lines += [f"      {p:5.1f}%  {n}" for n, p in summary["self"][:top]]
    lines.append("    inclusive:")
    lines += [f"      {p:5.1f}%  {n}" for n, p in summary["inclusive"][:top]]
    return "\n".join(lines)


# ── raw SQLite baselines (same schema and durability as the server) ──────────

SCHEMA_PRAGMAS = ("PRAGMA journal_mode = WAL", "PRAGMA synchronous = FULL")


def raw_store(path: Path) -> sqlite3.Connection:
    """A fresh file with the server's message table, 16 KiB pages, WAL, synchronous=FULL."""
    from sessions_server.storage.schema import MESSAGES_DDL, NEW_FILE_PAGE_SIZE

    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            Path(str(path) + suffix).unlink()
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA page_size = {NEW_FILE_PAGE_SIZE}")
    for pragma in SCHEMA_PRAGMAS:
        conn.execute(pragma)
    conn.execute(MESSAGES_DDL)
    return conn


INSERT_SQL = """INSERT INTO cf_agents_session_messages
    (session_id, id, seq, parent_id, type, role, content, content_chunks, token_estimate, created_at, content_hash)
    VALUES (?, ?, ?, ?, 'message', ?, ?, 0, ?, ?, ?)"""


def raw_row(seq: int, ident: str, parent: str | None, content: str) -> tuple[Any, ...]:
    return ("", ident, seq, parent, "user", content, len(content) // 4, int(time.time() * 1000), None)


# ── upstream oracle (optional) ───────────────────────────────────────────────


def oracle_dir() -> Path | None:
    """The project's oracle (tests/conformance/oracle) if present, else /tmp/oracle."""
    for candidate in (ROOT / "tests" / "conformance" / "oracle", Path("/tmp/oracle")):
        if (candidate / "serve.mjs").exists():
            return candidate
    return None


def prepare_oracle() -> tuple[Path | None, str]:
    """Installs the oracle's npm packages when needed; (dir, '') or (None, reason to skip)."""
    node = shutil.which("node")
    if node is None:
        return None, "node not found"
    directory = oracle_dir()
    if directory is None:
        return None, "oracle directory not found"
    ensure = directory / "ensure.sh"
    if ensure.exists():
        result = subprocess.run(["bash", str(ensure)], capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            return None, f"oracle install failed: {result.stderr.strip()[-300:]}"
    if not (directory / "node_modules" / "miniflare").exists():
        return None, f"oracle not installed in {directory} (node_modules missing)"
    return directory, ""


class OracleProcess(ChildProcess):
    """`node serve.mjs --port 0 --persist DIR` (upstream agents@0.32.0 in local workerd)."""

    name = "oracle"

    def __init__(self, directory: Path, persist: Path, log_path: Path) -> None:
        persist.mkdir(parents=True, exist_ok=True)
        args = [shutil.which("node") or "node", "serve.mjs", "--port", "0", "--persist", str(persist)]
        bundle, source = directory / "dist" / "worker.js", directory / "src" / "worker.js"
        if bundle.exists() and source.exists() and bundle.stat().st_mtime >= source.stat().st_mtime:
            args.append("--no-bundle")  # the bundle is current; otherwise serve.mjs rebuilds it (offline, ~2 s)
        env = {**os.environ, "WRANGLER_SEND_METRICS": "false", "CI": "true"}
        log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            args, cwd=directory, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env
        )
        log.close()
        match = _wait_for_line(self.proc, r"listening on http://127\.0\.0\.1:(\d+)", 120, "oracle")
        self.port = int(match.group(1))
        self.client = OracleClient(self.port)
        deadline = time.monotonic() + 60
        while not self.client.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("oracle /health never answered")
            time.sleep(0.1)

    def workerd_pids(self) -> list[int]:
        """The oracle's process tree (node + workerd), for CPU or RSS accounting."""
        out: list[int] = []
        todo = [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                todo += [int(c) for c in children]
        return out


class OracleClient:
    """Minimal keep-alive HTTP client for the oracle's `POST /obj/:key/:session/:op`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def healthy(self) -> bool:
        try:
            self.conn.request("GET", "/health")
            response = self.conn.getresponse()
            response.read()
            return response.status == 200
        except OSError:
            self.conn.close()
            return False

    def raw(self, key: str, op: str, body: bytes, session: str = "-") -> bytes:
        path = f"/obj/{urllib.parse.quote(key, safe='')}/{urllib.parse.quote(session, safe='')}/{op}"
        for attempt in range(2):  # the server may close an idle keep-alive connection
            try:
                self.conn.request("POST", path, body=body, headers={"content-type": "application/json"})
                response = self.conn.getresponse()
                data = response.read()
                break
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
                if attempt == 1:
                    raise
        if response.status != 200:
            raise RuntimeError(f"oracle {op}: HTTP {response.status}: {data[:300]!r}")
        return data

    def call(self, key: str, op: str, body: dict[str, Any] | None = None, session: str = "-") -> Any:
        payload = json.loads(self.raw(key, op, json.dumps(body or {}).encode(), session))
        if not payload.get("ok"):
            raise RuntimeError(f"oracle {op}: {payload.get('error')}")
        return payload["result"]


# ── results ──────────────────────────────────────────────────────────────────


@dataclass
class Row:
    """One line of the results table."""

    workload: str
    metric: str  # what the numbers are, with unit
    service: float | None
    baselines: dict[str, float | None] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    target: str = ""
    verdict: str = ""  # PASS / MISS / "" (no target) / SKIP
    notes: str = ""
    reps: list[float] = field(default_factory=list)


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if value != value:  # NaN
        return "nan"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 10:
        return f"{value:.2f}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.3g}"


def print_rows(rows: list[Row], out: Callable[[str], None] = print) -> None:
    for row in rows:
        base = "; ".join(f"{k} {fmt(v)}" for k, v in row.baselines.items()) or "—"
        ratio = "; ".join(f"{k} {fmt(v)}x" for k, v in row.ratios.items()) or "—"
        out(
            f"| {row.workload} | {row.metric} | {fmt(row.service)} | {base} | {ratio} | {row.target or '—'} | {row.verdict or '—'} |"
        )
        if row.notes:
            out(f"|   ↳ | {row.notes} | | | | | |")


# Messages per response, as the clients ask for them (one gRPC frame per message costs more than
# the message on long reads).
PACKED = 400


def newest_first(stub: Any, key: str, take: int, *, limited: bool = False) -> tuple[float, float]:
    """(seconds to the first message, seconds to `take` messages) of a newest-first StreamHistory
    through the generated stub, which is then cancelled. `limited` asks for `take` messages
    (`max_messages`), so the server stops there; otherwise it streams on until the cancel."""
    from sessions_client._common import routing_metadata
    from sessions_proto.v1 import sessions_pb2 as pb

    t = timer()
    request = pb.StreamHistoryRequest(
        object_key=key, newest_first=True, max_messages_per_response=PACKED, max_messages=take if limited else 0
    )
    call = stub.StreamHistory(request, metadata=routing_metadata(key))
    first = 0.0
    got = 0
    for response in call:
        for frame in response.frames or [response.frame]:
            if frame.HasField("info"):
                got += 1
                if got == 1:
                    first = t()
        if got >= take:
            break
    whole = t()
    call.cancel()
    return first, whole


def timer() -> Callable[[], float]:
    start = time.perf_counter()
    return lambda: time.perf_counter() - start


@contextlib.contextmanager
def elapsed(label: str, log: Callable[[str], None]) -> Iterator[None]:
    t = timer()
    yield
    log(f"  [{label}: {t():.1f}s]")
