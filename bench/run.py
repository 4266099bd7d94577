"""The benchmark of issue 11: every workload against the service and, in the same run, its baselines.

    python bench/run.py [--quick] [--json out.json] [--profile DIR] [--only NAME,...] [--no-upstream]

Prints a table of medians (over several repetitions, baselines interleaved with the service) with
ratios and each target's PASS/MISS, and writes the same as JSON. The server runs as a subprocess
(`python -m sessions_server.cli serve`) on loopback with a fresh data directory; the client is this
process, through the generated stubs (the Python client library where noted). Baselines:
  echo      bench/echo_server.py, a bare grpc.aio server (generic handlers, raw bytes), subprocess
  sqlite    raw sqlite3 in this process, same table, 16 KiB pages, WAL, synchronous=FULL
  openai    openai-agents SQLiteSession (file database, its defaults), in this process
  upstream  agents@0.32.0 in local workerd through its HTTP harness (tests/conformance/oracle);
            skipped with a reason when node or the oracle is not available
Installs bench/requirements.txt into the running interpreter first (skip with --no-install).
See bench/README.md for what each workload measures.
"""

# ruff: noqa: E501  (result tables are printed as long Markdown rows)

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from common import (
    BENCH_DIR,
    INSERT_SQL,
    MIB,
    PACKED,
    ROOT,
    CpuMeter,
    EchoProcess,
    MessageFactory,
    OracleProcess,
    Profiler,
    Row,
    ServerProcess,
    big_message_json,
    fmt,
    format_profile,
    hibernate,
    median,
    newest_first,
    percentile,
    prepare_oracle,
    raw_row,
    raw_store,
    read_status_kib,
    timer,
    vocabulary,
)

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.paths import object_path

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.max_send_message_length", 64 * MIB)]
ECHO_METHOD = "/bench.Echo/Echo"
ECHO_STREAM = "/bench.Echo/Stream"
ECHO_COMMIT = "/bench.Echo/Commit"
TEMPLATE_KEY = "cold-XXXXX"  # same length as the keys it is copied to
WORKLOADS = ("serial", "concurrent", "batch", "history", "recent", "large", "search", "cold")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("PASS" if ok else "MISS")


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def install_requirements() -> str:
    """pip-installs bench/requirements.txt when something in it is missing; '' or the error."""
    spy = Path(sys.executable).with_name("py-spy")
    if importlib.util.find_spec("agents") is not None and (spy.exists() or shutil.which("py-spy")):
        return ""
    log("installing bench/requirements.txt into this interpreter's environment ...")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "-r", str(BENCH_DIR / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    importlib.invalidate_caches()
    return "" if result.returncode == 0 else result.stderr.strip()[-400:]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        q = args.quick
        self.reps = args.reps or (3 if q else 5)
        self.n_serial = 100 if q else 400
        self.n_concurrent = 15 if q else 50  # appends per client per rep (16 clients)
        self.n_batch_calls = 5 if q else 20  # AppendMessages calls of 100 per rep
        self.n_history = 10_000
        self.n_recent_samples = 20 if q else 60
        self.n_cold_samples = 12 if q else 40
        self.n_large_reps = 3 if q else 5
        self.n_search = 10_000 if q else 100_000
        self.n_cold_objects = 1_000 if q else 10_000
        self.work = args.work_dir or Path(tempfile.mkdtemp(prefix="sessions-bench-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.rows: list[Row] = []
        self.profiles: dict[str, Any] = {}
        self.skips: dict[str, str] = {}
        self.extra: dict[str, Any] = {}
        self.server: ServerProcess | None = None
        self.echo: EchoProcess | None = None
        self.oracle: OracleProcess | None = None
        self.stub: Any = None
        self.echo_call: Any = None
        self.client: SessionsClient | None = None
        self.channels: list[grpc.Channel] = []
        self.upstream_reason = ""
        self.openai_reason = ""
        self.up_history_key: str | None = None

    # ── lifecycle ────────────────────────────────────────────────────────────

    def start(self) -> None:
        if not self.args.no_install:
            problem = install_requirements()
            if problem:
                log(f"pip install -r bench/requirements.txt failed: {problem}")
        if importlib.util.find_spec("agents") is None:
            self.openai_reason = "skipped: openai-agents not installed (pip install -r bench/requirements.txt)"
        self.server = ServerProcess(self.work / "data", ["--max-open-objects", "32"])
        log(f"server {self.server.address} pid {self.server.pid}; data {self.work / 'data'}")
        self.echo = EchoProcess(commit_file=self.work / "echo-commit.sqlite")
        channel = grpc.insecure_channel(self.server.address, options=CHANNEL_OPTIONS)
        echo_channel = grpc.insecure_channel(self.echo.address, options=CHANNEL_OPTIONS)
        self.channels += [channel, echo_channel]
        self.stub = pb_grpc.SessionServiceStub(channel)
        self.echo_call = echo_channel.unary_unary(ECHO_METHOD)
        self.echo_stream = echo_channel.unary_stream(ECHO_STREAM)
        self.echo_commit = echo_channel.unary_unary(ECHO_COMMIT)
        self.client = SessionsClient(self.server.address, options=CHANNEL_OPTIONS)
        if self.args.no_upstream:
            self.upstream_reason = "skipped: --no-upstream"
        else:
            directory, reason = prepare_oracle()
            if directory is None:
                self.upstream_reason = f"skipped: node/oracle not available ({reason})"
            else:
                try:
                    self.oracle = OracleProcess(directory, self.work / "oracle", self.work / "oracle.log")
                    log(f"upstream oracle on port {self.oracle.port} ({directory})")
                except Exception as exc:
                    self.upstream_reason = f"skipped: node/oracle not available (start failed: {exc})"
        if self.upstream_reason:
            log(self.upstream_reason)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        for channel in self.channels:
            channel.close()
        for child in (self.oracle, self.echo, self.server):
            if child is not None:
                with contextlib.suppress(Exception):
                    child.stop()

    def profile(self, name: str, pid: int | None = None) -> Profiler:
        assert self.server is not None
        return Profiler(pid or self.server.pid, self.args.profile, name)

    def keep_profile(self, name: str, prof: Profiler) -> None:
        if prof.summary:
            self.profiles[name] = prof.summary

    def add(self, row: Row) -> None:
        self.rows.append(row)
        base = "; ".join(f"{k} {fmt(v)}" for k, v in row.baselines.items())
        rat = "; ".join(f"{k} {fmt(v)}x" for k, v in row.ratios.items())
        log(
            f"  {row.workload} | {row.metric}: service {fmt(row.service)} | {base} | {rat} | {row.target} {row.verdict}"
        )

    # ── helpers ──────────────────────────────────────────────────────────────

    def md(self, key: str) -> tuple[tuple[str, str], ...]:
        return routing_metadata(key)

    def append_items(self, key: str, jsons: list[str], session: str = "") -> None:
        # As every client sends writes: the server answers without the JSON it stored as sent.
        request = pb.AppendMessagesRequest(
            object_key=key,
            session_id=session,
            items=[pb.AppendItem(message_json=j) for j in jsons],
            omit_json_as_sent=True,
        )
        self.stub.AppendMessages(request, metadata=self.md(key))

    def build(self, key: str, count: int, size: int = 1024, batch: int = 1000, prefix: str = "m") -> float:
        factory = MessageFactory(size, prefix=prefix)
        t = timer()
        done = 0
        while done < count:
            n = min(batch, count - done)
            self.append_items(key, factory.batch(n))
            done += n
        return count / t()

    def touch(self, key: str) -> None:
        for _ in self.stub.GetLatestLeaf(pb.GetLatestLeafRequest(object_key=key), metadata=self.md(key)):
            pass

    # More objects than the server's --max-open-objects 32: touching them all closes any other.
    FILLERS = tuple(f"filler-{i}" for i in range(40))

    def make_fillers(self) -> None:
        for f in self.FILLERS:
            self.append_items(f, [MessageFactory(200, prefix="f").json(0)])  # the same id: idempotent

    def close_object(self, path: Path) -> bool:
        """Makes the server close the object at `path` (LRU eviction); False if it stayed open."""
        assert self.server is not None

        def touch_fillers() -> None:
            for f in self.FILLERS:
                self.touch(f)

        return hibernate(self.server.pid, path, touch_fillers)

    def openai_session(self, name: str) -> Any:
        from agents import SQLiteSession

        return SQLiteSession(name, self.work / f"openai-{name}.db")

    # ── 1. serial durable appends ────────────────────────────────────────────

    def w_serial(self) -> None:
        n = self.n_serial
        key = "serial"
        factory = MessageFactory(1024, prefix="s")
        md = self.md(key)
        sample = pb.AppendMessageRequest(object_key=key, message_json=factory.json(10**6 - 1), omit_json_as_sent=True)
        payload = sample.SerializeToString()
        raw = raw_store(self.work / "raw-serial.sqlite")
        raw_seq = [0]
        upstream_key = f"serial-{int(time.time())}"
        openai = None
        if not self.openai_reason:
            openai = self.openai_session("serial")
        openai_loop = asyncio.new_event_loop()
        text = factory.texts[0]
        svc, svc_lat, echo, sql, up, oa, echo_commit = [], [], [], [], [], [], []
        for _ in range(3):  # warm-up
            self.stub.AppendMessage(
                pb.AppendMessageRequest(object_key=key, message_json=factory.json(), omit_json_as_sent=True),
                metadata=md,
            )
            self.echo_call(payload)
            self.echo_commit(payload)
        assert self.server is not None and self.echo is not None
        svc_cpu, echo_cpu = CpuMeter(self.server.pid), CpuMeter(self.echo.pid)
        echo_commit_cpu = CpuMeter(self.echo.pid)
        with self.profile("serial") as prof:
            for _rep in range(self.reps):
                lat = []
                t = timer()
                with svc_cpu:
                    for _ in range(n):
                        t0 = time.perf_counter()
                        self.stub.AppendMessage(
                            pb.AppendMessageRequest(
                                object_key=key, message_json=factory.json(), omit_json_as_sent=True
                            ),
                            metadata=md,
                        )
                        lat.append(time.perf_counter() - t0)
                svc.append(n / t())
                svc_lat += lat
                t = timer()
                with echo_cpu:
                    for _ in range(n):
                        self.echo_call(payload)
                echo.append(n / t())
                t = timer()
                with echo_commit_cpu:
                    for _ in range(n):
                        self.echo_commit(payload)
                echo_commit.append(n / t())
                t = timer()
                for _ in range(n):
                    raw_seq[0] += 1
                    s = raw_seq[0]
                    raw.execute("BEGIN IMMEDIATE")
                    raw.execute(
                        INSERT_SQL, raw_row(s, f"r{s:07d}", f"r{s - 1:07d}" if s > 1 else None, factory.json(s))
                    )
                    raw.execute("COMMIT")
                sql.append(n / t())
                if self.oracle is not None:
                    t = timer()
                    for i in range(n):
                        body = json.dumps({"message": json.loads(factory.json(10**6 + len(up) * n + i))}).encode()
                        self.oracle.client.raw(upstream_key, "appendMessage", body)
                    up.append(n / t())
                if openai is not None:

                    async def add_many() -> None:
                        for i in range(n):
                            await openai.add_items([{"role": "user", "content": f"{text} {i}"}])

                    t = timer()
                    openai_loop.run_until_complete(add_many())
                    oa.append(n / t())
        self.keep_profile("serial", prof)
        openai_loop.close()
        raw.close()
        svc_ops, echo_ops, sql_ops = median(svc), median(echo), median(sql)
        floor = 1.0 / (1.0 / echo_ops + 1.0 / sql_ops)
        up_ops = median(up) if up else None
        baselines: dict[str, float | None] = {
            "echo": echo_ops,
            "sqlite commit": sql_ops,
            "composite floor": floor,
            "echo + commit": median(echo_commit),
            "upstream": up_ops,
            "openai add_items": median(oa) if oa else None,
        }
        ratios = {
            "vs floor": svc_ops / floor,
            "vs upstream": ratio(svc_ops, up_ops),
            "vs openai": ratio(svc_ops, median(oa) if oa else None),
        }
        ok_floor = svc_ops / floor >= 0.8
        ok_up = None if up_ops is None else svc_ops / up_ops >= 2.0
        notes = [
            f"service p50 {1000 * percentile(svc_lat, 50):.2f} ms, p99 {1000 * percentile(svc_lat, 99):.2f} ms; "
            f"{n} appends x {self.reps} reps, request {len(payload)} B; server CPU "
            f"{1000 * svc_cpu.seconds / (n * self.reps):.2f} ms/append (echo {1000 * echo_cpu.seconds / (n * self.reps):.2f} ms/call)",
            # Not a target baseline: the same durable commit behind a grpc.aio handler with no
            # service logic shows what the stack costs when each call waits for an fsync.
            f"echo + commit = the echo server storing each request in a durable commit on a worker "
            f"thread, no service logic (diagnostic, not a target): server CPU "
            f"{1000 * echo_commit_cpu.seconds / (n * self.reps):.2f} ms/call; service vs it "
            f"{svc_ops / median(echo_commit):.2f}x",
        ]
        if up_ops is None:
            notes.append(f"upstream {self.upstream_reason}")
        if not oa:
            notes.append(f"openai {self.openai_reason}")
        self.add(
            Row(
                "serial 1 KB appends (1 client, 1 object, durable)",
                "appends/s",
                svc_ops,
                baselines,
                ratios,
                ">= 0.8x floor; >= 2x upstream",
                f"{verdict(ok_floor)} floor; "
                + (f"{verdict(ok_up)} upstream" if ok_up is not None else "upstream SKIP"),
                "; ".join(notes),
                svc,
            )
        )

    # ── 2. concurrent appends ────────────────────────────────────────────────

    async def _concurrent(
        self, target: str, clients: int, per_client: int, keys: list[str] | None, payload: bytes
    ) -> float:
        channels = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(clients)]
        try:
            if keys is None:
                calls = [ch.unary_unary(ECHO_METHOD) for ch in channels]
            else:
                calls = [pb_grpc.SessionServiceStub(ch).AppendMessage for ch in channels]
            factories = [
                MessageFactory(1024, prefix=f"c{i:02d}-{time.monotonic_ns() % 10**9}-") for i in range(clients)
            ]

            async def one(index: int, count: int) -> None:
                call = calls[index]
                if keys is None:
                    for _ in range(count):
                        await call(payload)
                    return
                key = keys[index]
                md = routing_metadata(key)
                factory = factories[index]
                for _ in range(count):
                    await call(
                        pb.AppendMessageRequest(object_key=key, message_json=factory.json(), omit_json_as_sent=True),
                        metadata=md,
                    )

            await asyncio.gather(*(one(i, 2) for i in range(clients)))  # connect + warm
            t = timer()
            await asyncio.gather(*(one(i, per_client) for i in range(clients)))
            return clients * per_client / t()
        finally:
            for ch in channels:
                await ch.close()

    def w_concurrent(self) -> None:
        assert self.server is not None and self.echo is not None
        clients, m = 16, self.n_concurrent
        payload = pb.AppendMessageRequest(
            object_key="conc-one", message_json=MessageFactory(1024).json(0), omit_json_as_sent=True
        ).SerializeToString()
        one, many, echo = [], [], []
        cpu_one, cpu_many, cpu_echo = CpuMeter(self.server.pid), CpuMeter(self.server.pid), CpuMeter(self.echo.pid)
        with self.profile("concurrent") as prof:
            for _ in range(self.reps):
                with cpu_one:
                    one.append(
                        asyncio.run(self._concurrent(self.server.address, clients, m, ["conc-one"] * clients, payload))
                    )
                with cpu_many:
                    many.append(
                        asyncio.run(
                            self._concurrent(
                                self.server.address, clients, m, [f"conc-{i}" for i in range(clients)], payload
                            )
                        )
                    )
                with cpu_echo:
                    echo.append(asyncio.run(self._concurrent(self.echo.address, clients, m, None, payload)))
        calls = clients * (m + 2) * self.reps
        self.keep_profile("concurrent", prof)
        e = median(echo)
        r1, r16 = median(one) / e, median(many) / e
        note = f"{clients} grpc.aio channels in one client process, {m} appends each x {self.reps} reps"
        cpu = (
            f"; server CPU {1000 * cpu_one.seconds / calls:.2f} ms/append to 1 object, "
            f"{1000 * cpu_many.seconds / calls:.2f} to 16 (echo {1000 * cpu_echo.seconds / calls:.2f} ms/call)"
        )
        self.add(
            Row(
                "16 concurrent clients -> 1 object",
                "appends/s",
                median(one),
                {"echo x16": e},
                {"vs echo": r1},
                ">= 0.7x echo",
                verdict(r1 >= 0.7),
                note + cpu + " (incl. connection set-up)",
                one,
            )
        )
        self.add(
            Row(
                "16 concurrent clients -> 16 objects",
                "appends/s",
                median(many),
                {"echo x16": e},
                {"vs echo": r16},
                "(report)",
                "",
                note,
                many,
            )
        )

    # ── 3. AppendMessages, 100 per call ──────────────────────────────────────

    def w_batch(self) -> None:
        k = self.n_batch_calls
        key = "batch"
        factory = MessageFactory(1024, prefix="b")
        raw = raw_store(self.work / "raw-batch.sqlite")
        seq = 0
        svc, sql = [], []
        self.append_items(key, factory.batch(100))  # warm (opens the object)
        assert self.server is not None
        cpu = CpuMeter(self.server.pid)
        with self.profile("batch") as prof:
            for _ in range(self.reps):
                batches = [factory.batch(100) for _ in range(k)]
                t = timer()
                with cpu:
                    for jsons in batches:
                        self.append_items(key, jsons)
                svc.append(100 * k / t())
                rows_list = []
                for _ in range(k):
                    rows = []
                    for _ in range(100):
                        seq += 1
                        rows.append(
                            raw_row(seq, f"r{seq:07d}", f"r{seq - 1:07d}" if seq > 1 else None, factory.json(seq))
                        )
                    rows_list.append(rows)
                t = timer()
                for rows in rows_list:
                    raw.execute("BEGIN IMMEDIATE")
                    raw.executemany(INSERT_SQL, rows)
                    raw.execute("COMMIT")
                sql.append(100 * k / t())
        self.keep_profile("batch", prof)
        raw.close()
        r = median(svc) / median(sql)
        self.add(
            Row(
                "AppendMessages, 100 x 1 KB per call",
                "messages/s",
                median(svc),
                {"sqlite 100/txn": median(sql)},
                {"vs sqlite": r},
                ">= 0.5x raw",
                verdict(r >= 0.5),
                f"{k} calls x {self.reps} reps; server CPU {1000 * cpu.seconds / (k * self.reps):.1f} ms/call "
                f"({1000 * cpu.seconds / (100 * k * self.reps):.3f} ms/message)",
                svc,
            )
        )

    # ── 4. history: full 10,000 x 1 KB; 2,000 vs openai-agents ───────────────

    def stream_all(self, key: str, **kw: Any) -> tuple[int, int, float]:
        t = timer()
        count = size = 0
        request = pb.StreamHistoryRequest(object_key=key, max_messages_per_response=PACKED, **kw)
        # Per message the loop takes its JSON and its length, as the scan baseline does per row.
        # Messages here are 1 KB, so each travels whole, in one frame: frames count messages.
        for response in self.stub.StreamHistory(request, metadata=self.md(key)):
            frames = response.frames or [response.frame]
            count += len(frames)
            for frame in frames:
                size += len(frame.json)
        return count, size, t()

    def w_history(self) -> None:
        assert self.server is not None and self.client is not None
        key = "history-10k"
        rate = self.build(key, self.n_history, 1024, 1000, prefix="h")
        self.extra["build_10k_msgs_per_s"] = rate
        path = object_path(self.server.data_dir, key)
        up_key = f"history-{int(time.time())}"
        openai = None if self.openai_reason else self.openai_session("history")
        loop = asyncio.new_event_loop()
        if openai is not None:
            text = MessageFactory(1024).texts[0]
            loop.run_until_complete(
                openai.add_items([{"role": "user", "content": f"{text} {i}"} for i in range(self.n_history)])
            )
        if self.oracle is not None:
            self.oracle.client.call(up_key, "bulkAppend", {"count": self.n_history, "textBytes": 950, "idPrefix": "h"})
            self.up_history_key = up_key
        self.stream_all(key)  # warm (open object, page cache)
        svc, svc_msgs, batched, raw, echo1, echo50, up_full, up_sum, oa = [], [], [], [], [], [], [], [], []
        walked = []
        # Each timed read follows an append, as an agent reads after adding a message: the server
        # then extends the path it remembered. The path's walk is measured apart, on an explicit
        # older leaf (the last message built), which the server does not remember at that point.
        built_leaf = MessageFactory(1024, prefix="h").ident(self.n_history - 1)
        appended = MessageFactory(1024, prefix="x")
        nbytes = count = 0
        assert self.echo is not None
        cpu, cpu_echo = CpuMeter(self.server.pid), CpuMeter(self.echo.pid)
        # From storage: the first read after the server closed the object, when nothing of it
        # is remembered.
        self.make_fillers()
        cold: list[float] = []
        with self.profile("history-10k") as prof:
            for _ in range(self.reps):
                if self.close_object(path):
                    _, cb, cs = self.stream_all(key)
                    cold.append(cb / MIB / cs)
                _, wb, ws = self.stream_all(key, leaf_id=built_leaf)
                walked.append(wb / MIB / ws)
                self.stream_all(key)  # the active leaf, walked again: remembered from here on
                self.append_items(key, [appended.json()])
                with cpu:
                    count, nbytes, seconds = self.stream_all(key)
                svc.append(nbytes / MIB / seconds)
                svc_msgs.append(count / seconds)
                _, b2, s2 = self.stream_all(key, batch_size=50)
                batched.append(b2 / MIB / s2)
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
                t = timer()
                raw_bytes = 0
                for (content,) in conn.execute("SELECT content FROM cf_agents_session_messages WHERE session_id = ''"):
                    raw_bytes += len(content)
                raw.append(raw_bytes / MIB / t())
                conn.close()
                # the same bytes through a bare gRPC stream: one frame per message, and 50 per frame
                frame = max(1, nbytes // max(1, count))
                t = timer()
                with cpu_echo:
                    for _ in self.echo_stream(f"{count} {frame}".encode()):
                        pass
                echo1.append(nbytes / MIB / t())
                t = timer()
                for _ in self.echo_stream(f"{max(1, count // 50)} {frame * 50}".encode()):
                    pass
                echo50.append(nbytes / MIB / t())
                if self.oracle is not None:
                    t = timer()
                    body = self.oracle.client.raw(up_key, "getHistory", b"{}")
                    up_full.append(len(body) / MIB / t())
                    t = timer()
                    self.oracle.client.call(up_key, "getHistory", {"summary": True})
                    up_sum.append(t())
                if openai is not None:
                    t = timer()
                    items = loop.run_until_complete(openai.get_items())
                    assert len(items) == self.n_history
                    oa.append(nbytes / MIB / t())
        self.keep_profile("history-10k", prof)
        s, rw = median(svc), median(raw)
        baselines = {
            "sqlite scan": rw,
            "echo stream 1/frame": median(echo1),
            "echo stream 50/frame": median(echo50),
            "upstream getHistory (HTTP, full JSON)": median(up_full) if up_full else None,
            "openai get_items": median(oa) if oa else None,
        }
        notes = [
            f"{count} msgs, {nbytes / MIB:.1f} MiB, {median(svc_msgs):,.0f} msgs/s, each read after an append (remembered path extended); "
            f"from storage (object reopened) {median(cold) if cold else float('nan'):.1f} MiB/s; path walked (older leaf: its path is not remembered, its messages are) {median(walked):.1f} MiB/s; batched (batch_size=50) {median(batched):.1f} MiB/s; "
            f"build {rate:,.0f} msgs/s; server CPU {1000 * cpu.seconds / (count * self.reps):.3f} ms/message "
            f"(echo stream 1/frame {1000 * cpu_echo.seconds / (count * self.reps):.3f} ms/frame)"
        ]
        if up_sum:
            notes.append(
                f"upstream getHistory inside the DO (summary only) {1000 * median(up_sum):.0f} ms = "
                f"{nbytes / MIB / median(up_sum):.1f} MiB/s"
            )
        else:
            notes.append(f"upstream {self.upstream_reason}")
        if not oa:
            notes.append(f"openai {self.openai_reason}")
        r = s / rw
        self.add(
            Row(
                "full history 10,000 x 1 KB (stream)",
                "MiB/s",
                s,
                baselines,
                {"vs sqlite scan": r, "vs upstream": ratio(s, baselines["upstream getHistory (HTTP, full JSON)"])},
                ">= 100 MiB/s and >= 0.4x scan",
                verdict(s >= 100 and r >= 0.4),
                "; ".join(notes),
                svc,
            )
        )
        if cold:
            # The same read when nothing of the object is remembered: an agent back after its
            # object was closed. Shown as its own row so that the remembered read above is not
            # the only history number in the table.
            c = median(cold)
            self.add(
                Row(
                    "full history 10,000 x 1 KB from storage (object reopened)",
                    "MiB/s",
                    c,
                    {"sqlite scan": rw, "openai get_items": baselines["openai get_items"]},
                    {"vs sqlite scan": c / rw},
                    "(report)",
                    "",
                    f"the first read after the server closed the object (LRU eviction), opening it included; "
                    f"{len(cold)} samples",
                    cold,
                )
            )

        # 2,000 messages: the client library's get_history (dicts) vs openai-agents get_items (dicts)
        key2 = "history-2k"
        self.build(key2, 2000, 1024, 1000, prefix="k")
        session = self.client.object(key2).session()
        session.get_history()
        oa2 = None if self.openai_reason else self.openai_session("history2k")
        if oa2 is not None:
            text = MessageFactory(1024).texts[0]
            loop.run_until_complete(oa2.add_items([{"role": "user", "content": f"{text} {i}"} for i in range(2000)]))
            loop.run_until_complete(oa2.get_items())
        svc2, oat = [], []
        extra = MessageFactory(1024, prefix="y")
        with self.profile("history-2k") as prof:
            for rep in range(self.reps):
                self.append_items(key2, [extra.json()])  # as above: each read follows an append
                t = timer()
                got = session.get_history()
                svc2.append(1000 * t())
                assert len(got) == 2001 + rep
                if oa2 is not None:
                    t = timer()
                    loop.run_until_complete(oa2.get_items())
                    oat.append(1000 * t())
        self.keep_profile("history-2k", prof)
        loop.close()
        o = median(oat) if oat else None
        rr = ratio(median(svc2), o)
        self.add(
            Row(
                "full history 2,000 x 1 KB (client get_history)",
                "ms",
                median(svc2),
                {"openai get_items": o},
                {"vs openai (time)": rr},
                "<= 2x openai time",
                verdict(None if rr is None else rr <= 2.0),
                "" if oat else f"openai {self.openai_reason}",
                svc2,
            )
        )

    # ── 4b. last 50 messages: first-message latency, warm and cold ────────────

    def w_recent(self) -> None:
        assert self.server is not None
        key = "history-10k"
        if self.args.only and "history" not in self.args.only:
            self.build(key, self.n_history, 1024, 1000, prefix="h")
        path = object_path(self.server.data_dir, key)
        self.make_fillers()
        for _ in range(5):
            newest_first(self.stub, key, 50, limited=True)
        warm_first, warm_all, cold_first, cold_all = [], [], [], []
        raw_warm, raw_cold, up, oa, echo_first = [], [], [], [], []
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        q = "SELECT content FROM cf_agents_session_messages WHERE session_id = '' ORDER BY id DESC LIMIT 50"
        openai = None if self.openai_reason else self.openai_session("history")  # 10,000 items from w_history
        loop = asyncio.new_event_loop()
        if openai is not None and not loop.run_until_complete(openai.get_items(limit=1)):
            text = MessageFactory(1024).texts[0]
            loop.run_until_complete(
                openai.add_items([{"role": "user", "content": f"{text} {i}"} for i in range(self.n_history)])
            )
        up_key = self.up_history_key
        if self.oracle is not None and up_key is None:
            up_key = f"recent-{int(time.time())}"
            self.oracle.client.call(up_key, "bulkAppend", {"count": self.n_history, "textBytes": 950, "idPrefix": "h"})
        remembered_first: list[float] = []
        remembered_all: list[float] = []

        def sample(firsts: list[float], alls: list[float]) -> None:
            # Asked as upstream's harness reads (stop after 50): the stream ends there.
            first, whole = newest_first(self.stub, key, 50, limited=True)
            firsts.append(first)
            alls.append(whole)
            # The machine's floor in the same conditions: a bare gRPC stream's first frame,
            # also reached after the other processes' calls (a server woken from idle).
            t = timer()
            frames = self.echo_stream(b"50 1024")
            next(frames)
            echo_first.append(t())
            frames.cancel()
            t = timer()
            cur = conn.execute(q)
            cur.fetchone()
            raw_warm.append(t())
            cur.fetchall()
            if up_key is not None:
                t = timer()
                self.oracle.client.call(
                    up_key, "history", {"options": {"newestFirst": True}, "limit": 50, "summary": True}
                )  # type: ignore[union-attr]
                up.append(t())
            if openai is not None:
                t = timer()
                loop.run_until_complete(openai.get_items(limit=50))
                oa.append(t())

        with self.profile("recent-warm") as prof:
            for _ in range(self.n_recent_samples):
                sample(warm_first, warm_all)
            # The same read as a stream the client cancels after 50 messages: the server reads on
            # until the cancel arrives, and the next read meets that work.
            unlimited = [newest_first(self.stub, key, 50) for _ in range(self.n_recent_samples // 2)]
            # An agent reads its whole history after each turn: the server then remembers the
            # path and its messages, and the last 50 come from memory.
            request = pb.StreamHistoryRequest(object_key=key, max_messages_per_response=PACKED)
            for _ in self.stub.StreamHistory(request, metadata=self.md(key)):
                pass
            for _ in range(self.n_recent_samples):
                sample(remembered_first, remembered_all)
        self.keep_profile("recent-warm", prof)
        conn.close()
        with self.profile("recent-cold") as prof:
            skipped = 0
            for _ in range(self.n_cold_samples):
                if not self.close_object(path):
                    skipped += 1
                    continue
                first, whole = newest_first(self.stub, key, 50, limited=True)
                cold_first.append(first)
                cold_all.append(whole)
                t = timer()
                c = sqlite3.connect(path)
                c.execute("PRAGMA journal_mode = WAL")
                c.execute("PRAGMA synchronous = FULL")
                c.execute(q).fetchone()
                raw_cold.append(t())
                c.close()
        self.keep_profile("recent-cold", prof)
        loop.close()
        wf, cf = 1000 * median(warm_first), 1000 * median(cold_first)
        notes_w = (
            f"StreamHistory newest_first, max_messages=50; all 50: p50 {1000 * median(warm_all):.2f} ms; "
            f"first p90 {1000 * percentile(warm_first, 90):.2f} ms; {len(warm_first)} samples; "
            f"the stream unlimited and cancelled after 50: first p50 {1000 * median([u[0] for u in unlimited]):.2f} ms, "
            f"all 50 {1000 * median([u[1] for u in unlimited]):.2f} ms"
        )
        if not up:
            notes_w += f"; upstream {self.upstream_reason}"
        else:
            notes_w += "; upstream = history newestFirst limit 50 over HTTP (summary reply), whole call"
        self.add(
            Row(
                "last 50 of 10,000, warm object: first message",
                "ms p50",
                wf,
                {
                    "echo stream first frame": 1000 * median(echo_first),
                    "sqlite first row (open conn)": 1000 * median(raw_warm),
                    "upstream (50 msgs)": 1000 * median(up) if up else None,
                    "openai get_items(limit=50)": 1000 * median(oa) if oa else None,
                },
                {
                    "vs echo first frame (time)": ratio(median(warm_first), median(echo_first)),
                    "all 50 vs upstream (time)": ratio(median(warm_all), median(up)) if up else None,
                },
                "<= 2 ms",
                verdict(wf <= 2.0),
                notes_w,
                warm_first,
            )
        )
        rf = 1000 * median(remembered_first)
        self.add(
            Row(
                "last 50 of 10,000 after a whole read (remembered): first message",
                "ms p50",
                rf,
                {"echo stream first frame": 1000 * median(echo_first)},
                {"vs echo first frame (time)": ratio(median(remembered_first), median(echo_first))},
                "(report)",
                "",
                f"StreamHistory newest_first, max_messages=50, after one whole read of the path; all 50: p50 "
                f"{1000 * median(remembered_all):.2f} ms; first p90 {1000 * percentile(remembered_first, 90):.2f} ms; "
                f"{len(remembered_first)} samples",
                remembered_first,
            )
        )
        self.add(
            Row(
                "last 50 of 10,000, cold (hibernated) object: first message",
                "ms p50",
                cf,
                {"sqlite open + first row": 1000 * median(raw_cold)},
                {"vs sqlite": ratio(cf, 1000 * median(raw_cold))},
                "<= 5 ms",
                verdict(cf <= 5.0),
                f"all 50: p50 {1000 * median(cold_all):.2f} ms; closed by LRU eviction (requests to 40 other objects, --max-open-objects 32; "
                f"checked in /proc/<pid>/fd, {skipped} samples skipped); "
                f"OS page cache warm; {len(cold_first)} samples",
                cold_first,
            )
        )

    # ── 5. one 5 MB message ──────────────────────────────────────────────────

    def w_large(self) -> None:
        assert self.client is not None
        size = 5 * 1024 * 1024
        obj = self.client.object("large")
        app, read, echo, up_a, up_r = [], [], [], [], []
        text_json = big_message_json("big", size)
        up_key = f"large-{int(time.time())}"
        with self.profile("large") as prof:
            for rep in range(self.n_large_reps + 1):
                session = obj.session(f"s{rep}")
                t = timer()
                result = session.append_message(text_json)
                a = t()
                assert result.inserted
                t = timer()
                back = session.get_message("big")
                r = t()
                assert back is not None and len(back["parts"][0]["text"]) == size
                t = timer()
                self.echo_call(text_json.encode())
                e = t()
                if rep == 0:
                    continue  # warm-up
                app.append(a)
                read.append(r)
                echo.append(e)
                if self.oracle is not None:
                    body = json.dumps({"message": json.loads(text_json)}).encode()
                    t = timer()
                    self.oracle.client.raw(up_key, "appendMessage", body, session=f"s{rep}")
                    up_a.append(t())
                    t = timer()
                    self.oracle.client.raw(up_key, "getMessage", b'{"id":"big"}', session=f"s{rep}")
                    up_r.append(t())
        self.keep_profile("large", prof)
        a_ms, r_ms = 1000 * median(app), 1000 * median(read)
        note = "Python client (append picks UploadMessage above its unary limit; read reassembles pieces)"
        if not up_a:
            note += f"; upstream {self.upstream_reason}"
        self.add(
            Row(
                "one 5 MB message: append",
                "ms",
                a_ms,
                {"echo 5 MB unary": 1000 * median(echo), "upstream": 1000 * median(up_a) if up_a else None},
                {"vs upstream": ratio(a_ms, 1000 * median(up_a)) if up_a else None},
                "<= 100 ms",
                verdict(a_ms <= 100),
                note,
                app,
            )
        )
        self.add(
            Row(
                "one 5 MB message: read",
                "ms",
                r_ms,
                {"upstream": 1000 * median(up_r) if up_r else None},
                {"vs upstream": ratio(r_ms, 1000 * median(up_r)) if up_r else None},
                "<= 50 ms",
                verdict(r_ms <= 50),
                "",
                read,
            )
        )

    # ── 6. search ────────────────────────────────────────────────────────────

    def w_search(self) -> None:
        assert self.server is not None
        key = "search"
        rate = self.build(key, self.n_search, 1024, 1000, prefix="q")
        words = vocabulary()
        queries = [words[0], words[3], words[30], words[300], words[3000], f"{words[1]} {words[2]}", "u0004321"]
        md = self.md(key)

        def svc_query(q: str) -> int:
            # As the clients ask: the hits packed into few responses.
            request = pb.SearchMessagesRequest(object_key=key, query=q, limit=20, max_hits_per_response=1000)
            hits = 0
            for response in self.stub.SearchMessages(request, metadata=md):
                hits += len(response.hits)
            return hits

        t = timer()
        svc_query(words[5])  # first search builds the index (backfill), as upstream
        first_ms = 1000 * t()
        path = object_path(self.server.data_dir, key)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        sql = "SELECT id, role, session_id, content FROM cf_agents_session_fts WHERE cf_agents_session_fts MATCH ? ORDER BY rank LIMIT 20"
        svc: list[float] = []
        raw: list[float] = []
        per_query: dict[str, list[float]] = {q: [] for q in queries}
        per_raw: dict[str, list[float]] = {q: [] for q in queries}
        hits: dict[str, int] = {}
        for q in queries:
            svc_query(q)
        with self.profile("search") as prof:
            for _ in range(self.reps):
                for q in queries:
                    t = timer()
                    hits[q] = svc_query(q)
                    d = t()
                    svc.append(d)
                    per_query[q].append(d)
                    expression = '"' + q.replace('"', '""') + '"'
                    t = timer()
                    conn.execute(sql, (expression,)).fetchall()
                    d = t()
                    raw.append(d)
                    per_raw[q].append(d)
        self.keep_profile("search", prof)
        conn.close()
        s, r = 1000 * median(svc), 1000 * median(raw)
        detail = ", ".join(
            f"{q!r} {hits[q]} hits {1000 * median(per_query[q]):.1f}/{1000 * median(per_raw[q]):.1f} ms"
            for q in queries
        )
        self.extra["search_queries"] = {
            q: {"hits": hits[q], "service_ms": 1000 * median(per_query[q]), "raw_ms": 1000 * median(per_raw[q])}
            for q in queries
        }
        geo = math.exp(sum(math.log(median(per_query[q]) / median(per_raw[q])) for q in queries) / len(queries))
        self.add(
            Row(
                f"search over {self.n_search:,} messages (limit 20)",
                "ms p50",
                s,
                {"raw FTS5 query": r},
                {"vs raw (time)": s / r, "per-query geomean": geo},
                "(report)",
                "",
                f"first search (builds the index) {first_ms:,.0f} ms; build {rate:,.0f} msgs/s; service/raw per query: {detail}",
                svc,
            )
        )

    # ── 7. cold open of many objects ─────────────────────────────────────────

    def w_cold(self) -> None:
        n = self.n_cold_objects
        data = self.work / "cold-data"
        # A template object written by the server, then copied to n keys (the key recorded inside
        # each copy is rewritten): building 10,000 objects through the API would dominate the run.
        server = ServerProcess(data, ["--max-open-objects", "16"])
        try:
            client = SessionsClient(server.address, options=CHANNEL_OPTIONS)
            client.object(TEMPLATE_KEY).session().append_message(MessageFactory(1024).json(0))
            client.close()
        finally:
            server.stop()
        template = object_path(data, TEMPLATE_KEY)
        template_bytes = template.read_bytes()
        keys = [f"cold-{i:05d}" for i in range(n)]
        # The recorded key is the only place the key appears in the file; a same-length key can be
        # swapped in place (the record keeps its size). Otherwise rewrite it with SQL (slower).
        in_place = template_bytes.count(TEMPLATE_KEY.encode()) == 1
        t = timer()
        for key in keys:
            path = object_path(data, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            if in_place:
                path.write_bytes(template_bytes.replace(TEMPLATE_KEY.encode(), key.encode()))
                continue
            path.write_bytes(template_bytes)
            c = sqlite3.connect(path, isolation_level=None)
            c.execute("PRAGMA synchronous = OFF")
            c.execute("UPDATE _sessions_meta SET value = ? WHERE key = 'object_key'", (key,))
            c.close()
        setup_s = t()
        probe = sqlite3.connect(f"file:{object_path(data, keys[-1])}?mode=ro", uri=True)
        recorded = probe.execute("SELECT value FROM _sessions_meta WHERE key = 'object_key'").fetchone()
        assert probe.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        probe.close()
        assert recorded is not None and recorded[0] == keys[-1], recorded
        server = ServerProcess(data, ["--max-open-objects", "16"])
        try:
            channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
            stub = pb_grpc.SessionServiceStub(channel)
            echo_small = pb.GetLatestLeafRequest(object_key=keys[0]).SerializeToString()

            def leaf(key: str) -> None:
                got = 0
                for _response in stub.GetLatestLeaf(
                    pb.GetLatestLeafRequest(object_key=key), metadata=routing_metadata(key)
                ):
                    got += 1
                assert got == 1, key

            leaf(TEMPLATE_KEY)
            lat: list[float] = []
            with self.profile("cold-open", server.pid) as prof:
                t = timer()
                for key in keys:
                    t0 = time.perf_counter()
                    leaf(key)
                    lat.append(time.perf_counter() - t0)
                total = t()
            self.keep_profile("cold-open", prof)
            warm = []
            for _ in range(200):
                t0 = time.perf_counter()
                leaf(TEMPLATE_KEY)
                warm.append(time.perf_counter() - t0)
            echo = []
            for _ in range(200):
                t0 = time.perf_counter()
                self.echo_call(echo_small)
                echo.append(time.perf_counter() - t0)
            rss = read_status_kib(server.pid)
            channel.close()
        finally:
            server.stop()
        raw = []
        for key in keys[: min(n, 2000)]:
            path = object_path(data, key)
            t0 = time.perf_counter()
            c = sqlite3.connect(path)
            c.execute("PRAGMA busy_timeout = 10000")
            c.execute("PRAGMA journal_mode = WAL")
            c.execute("PRAGMA synchronous = FULL")
            c.execute(
                "SELECT content FROM cf_agents_session_messages WHERE session_id = '' ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            c.close()
            raw.append(time.perf_counter() - t0)
        p50, rp, ep = 1000 * median(lat), 1000 * median(raw), 1000 * median(echo)
        floor = rp + ep
        self.add(
            Row(
                f"cold open of {n:,} objects (first request each, GetLatestLeaf)",
                "ms p50",
                p50,
                {
                    "raw open+query": rp,
                    "echo": ep,
                    "composite floor": floor,
                    "same request, warm object": 1000 * median(warm),
                },
                {"vs floor (time)": p50 / floor},
                "(report)",
                "",
                f"{n / total:,.0f} objects/s, p99 {1000 * percentile(lat, 99):.2f} ms; --max-open-objects 16; server RSS after "
                f"{rss['VmRSS'] / 1024:.0f} MiB (peak {rss['VmHWM'] / 1024:.0f}); setup by file copy {setup_s:.1f} s",
                lat,
            )
        )

    # ── run ──────────────────────────────────────────────────────────────────

    def run(self) -> int:
        chosen = [w for w in WORKLOADS if not self.args.only or w in self.args.only]
        started = time.time()
        self.start()
        failures = 0
        try:
            for name in chosen:
                log(f"== {name}")
                t = timer()
                try:
                    getattr(self, f"w_{name}")()
                except Exception:
                    failures += 1
                    log(traceback.format_exc())
                    self.rows.append(
                        Row(name, "error", None, verdict="ERROR", notes=traceback.format_exc().splitlines()[-1])
                    )
                log(f"   ({t():.1f} s)")
            if self.server is not None:
                status = read_status_kib(self.server.pid)
                self.extra["server_rss_end_mib"] = status["VmRSS"] / 1024
                self.extra["server_peak_rss_mib"] = status["VmHWM"] / 1024
        finally:
            self.stop()
        self.report(time.time() - started)
        if not self.args.keep and self.args.work_dir is None:  # only a temp dir made here
            shutil.rmtree(self.work, ignore_errors=True)
        return 1 if failures else 0

    def report(self, seconds: float) -> None:
        meta = {
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "sqlite": sqlite3.sqlite_version,
            "machine": f"{platform.machine()} {platform.system()} cpus={os.cpu_count()}",
            "loadavg_end": os.getloadavg(),
            "quick": self.args.quick,
            "reps": self.reps,
            "seconds": round(seconds, 1),
            "upstream": self.upstream_reason or "agents@0.32.0 in local workerd (Miniflare), HTTP",
            "openai": self.openai_reason or _version("openai-agents"),
        }
        with contextlib.suppress(OSError):
            meta["git"] = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
        out = print
        out("")
        out(
            f"## make bench — {meta['when']}, {meta['machine']}, Python {meta['python']}, grpcio {meta['grpcio']}, "
            f"SQLite {meta['sqlite']}{' (quick)' if self.args.quick else ''}; {meta['seconds']} s; medians of {self.reps} reps"
        )
        out(
            f"upstream: {meta['upstream']}; openai-agents: {meta['openai']}; load average at end {meta['loadavg_end'][0]:.1f}"
        )
        out("")
        out("| workload | unit | service | baselines (same run) | ratios | target | verdict |")
        out("|---|---|---|---|---|---|---|")
        from common import print_rows

        print_rows(self.rows, out)
        if self.extra:
            out("")
            out("extra: " + json.dumps({k: v for k, v in self.extra.items() if k != "search_queries"}, default=str))
        if self.profiles:
            out("")
            out("### server profiles (py-spy, busy samples only)")
            for name, summary in self.profiles.items():
                out(f"\n{name}:\n{format_profile(summary)}")
        if self.args.json:
            doc = {
                "meta": meta,
                "rows": [row.__dict__ for row in self.rows],
                "extra": self.extra,
                "profiles": self.profiles,
            }
            self.args.json.parent.mkdir(parents=True, exist_ok=True)
            self.args.json.write_text(json.dumps(doc, indent=1, default=str))
            log(f"wrote {self.args.json}")


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return f"{dist} {version(dist)}"
    except Exception:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts (search over 10,000; 1,000 cold objects)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--reps", type=int, help="repetitions per workload (default 5; 3 with --quick)")
    parser.add_argument(
        "--only",
        type=lambda s: [w.strip() for w in s.split(",") if w.strip()],
        help=f"comma-separated subset of: {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--profile", type=Path, help="py-spy the server during each workload; raw profiles into DIR")
    parser.add_argument("--no-upstream", action="store_true", help="skip the upstream (node) baselines")
    parser.add_argument("--no-install", action="store_true", help="do not pip-install bench/requirements.txt")
    parser.add_argument("--work-dir", type=Path, help="data directories go here (default: a fresh temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    if args.only:
        unknown = [w for w in args.only if w not in WORKLOADS]
        if unknown:
            parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
