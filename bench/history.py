"""History reads at scale (issue 3): newest-first latency, forward streaming throughput, server RSS.

    python bench/history.py [--quick] [--json out.json] [--profile DIR]

What it measures, against a `sessions-server` subprocess on loopback (fresh data directory):
  * transcripts of 100, 10,000 and 100,000 messages of ~1 KB, one linear chain each, built with
    AppendMessages in batches of 1,000 (the build rate is reported too);
  * newest-first time to first message (StreamHistory newest_first, then cancel): p50 of many
    samples; the ratio 100,000 vs 100 has a target of <= 1.5x;
  * forward streaming (StreamHistory root first, generated stub, default options) of the whole
    path: messages/s and MiB/s of message JSON. A forward read returns at most 10,001 messages
    (upstream's depth cap of 10,000 ancestors), so at 100,000 this is the capped path: the newest
    10,001 messages. Compared with a raw sqlite3 scan (SELECT content) of exactly the rows that
    were streamed, from the object file, in this process;
  * server peak RSS while streaming a ~200 MB transcript (10,000 messages of ~20 KB, under the
    depth cap so the whole transcript streams), next to the same for the 10,000 x 1 KB (10 MB) one:
    VmRSS sampled every 5 ms from /proc/<pid>/status, and VmHWM after resetting it. Target: growth
    flat in transcript size and under 100 MB for the 200 MB transcript.
`--quick` uses 20 MB for the RSS transcript and fewer samples (the 100,000 transcript stays).
"""

# ruff: noqa: E501  (result tables are printed as long Markdown rows)

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from common import (
    MIB,
    PACKED,
    MessageFactory,
    Profiler,
    RssSampler,
    ServerProcess,
    format_profile,
    hibernate,
    median,
    newest_first,
    percentile,
    read_status_kib,
    reset_peak_rss,
    timer,
)

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.paths import object_path

BATCH = 1000
MAX_OPEN = 4  # --max-open-objects: touching the fillers hibernates the measured object
FILLERS = [f"filler-{i}" for i in range(MAX_OPEN + 2)]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build(client: SessionsClient, key: str, count: int, size: int, batch: int, prefix: str = "m") -> float:
    """Appends `count` messages of ~`size` bytes in AppendMessages calls of `batch`; msgs/s."""
    factory = MessageFactory(size, prefix=prefix)
    session = client.object(key).session()
    t = timer()
    done = 0
    while done < count:
        n = min(batch, count - done)
        session.append_messages(factory.batch(n))
        done += n
    return count / t()


def stream_forward(stub: Any, key: str) -> tuple[int, int, str, str, float]:
    """(messages, JSON bytes, first id, last id, seconds) of a full forward StreamHistory."""
    md = routing_metadata(key)
    t = timer()
    count = size = 0
    first = last = ""
    request = pb.StreamHistoryRequest(object_key=key, max_messages_per_response=PACKED)
    frames: Any = []
    # Per message the loop takes its JSON and its length, as the raw scan does per row. The
    # messages here travel whole, one frame each: frames count them.
    for response in stub.StreamHistory(request, metadata=md):
        frames = response.frames or [response.frame]
        if not first:
            first = frames[0].info.id
        count += len(frames)
        for frame in frames:
            size += len(frame.json)  # ASCII JSON: characters = bytes
    last = frames[-1].info.id if frames else ""
    return count, size, first, last, t()


def raw_scan(path: Path, first_id: str, last_id: str) -> tuple[int, int, float]:
    """(rows, bytes, seconds) of SELECT content over the streamed id range, read-only, in-process."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        t = timer()
        rows = size = 0
        for (content,) in conn.execute(
            "SELECT content FROM cf_agents_session_messages WHERE session_id = '' AND id BETWEEN ? AND ?",
            (first_id, last_id),
        ):
            rows += 1
            size += len(content)
        return rows, size, t()
    finally:
        conn.close()


def rss_while_streaming(server: ServerProcess, stub: Any, key: str) -> dict[str, Any]:
    before = read_status_kib(server.pid)["VmRSS"]
    reset = reset_peak_rss(server.pid)
    with RssSampler(server.pid, 0.005) as sampler:
        count, size, _, _, seconds = stream_forward(stub, key)
    after = read_status_kib(server.pid)
    peak = max(sampler.peak_kib, after["VmHWM"] if reset else 0)
    return {
        "messages": count,
        "transcript_mib": size / MIB,
        "rss_before_mib": before / 1024,
        "rss_peak_mib": peak / 1024,
        "rss_after_mib": after["VmRSS"] / 1024,
        "growth_mib": (peak - before) / 1024,
        "hwm_reset": reset,
        "samples": sampler.samples,
        "seconds": seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 MB RSS transcript, fewer samples")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--sizes", default="100,10000,100000", help="transcript sizes (messages)")
    parser.add_argument("--big-mb", type=int, help="RSS transcript size in MB (default 200; 20 with --quick)")
    parser.add_argument("--reps", type=int, help="forward-stream repetitions (default 5; 3 with --quick)")
    parser.add_argument("--samples", type=int, help="newest-first samples per size (default 60; 30 with --quick)")
    parser.add_argument("--work-dir", type=Path, help="where the data directory goes (default: a temp dir)")
    parser.add_argument("--profile", type=Path, help="py-spy profiles of the server into this directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (data of ~300 MB)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    big_mb = args.big_mb or (20 if args.quick else 200)
    reps = args.reps or (3 if args.quick else 5)
    samples = args.samples or (30 if args.quick else 60)
    cold_samples = max(5, samples // 3)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="sessions-bench-history-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results: dict[str, Any] = {
        "meta": {
            "bench": "history",
            "python": platform.python_version(),
            "machine": f"{platform.machine()} {platform.system()} cpus={__import__('os').cpu_count()}",
            "quick": args.quick,
            "reps": reps,
            "newest_first_samples": samples,
            "work_dir": str(work),
        },
        "sizes": {},
    }
    server = ServerProcess(work / "data", ["--max-open-objects", str(MAX_OPEN)])
    log(f"server {server.address} pid {server.pid}, data {work / 'data'}")
    options = [("grpc.max_receive_message_length", 64 * MIB)]
    channel = grpc.insecure_channel(server.address, options=options)
    stub = pb_grpc.SessionServiceStub(channel)
    client = SessionsClient(server.address, options=options)
    try:
        for filler in FILLERS:
            client.object(filler).session().append_message(MessageFactory(200, prefix="f").json(0))
        for size in sizes:
            key = f"history-{size}"
            rate = build(client, key, size, 1024, BATCH)
            log(f"built {size} x 1 KB in batches of {BATCH}: {rate:,.0f} msgs/s")
            entry: dict[str, Any] = {"build_msgs_per_s": rate}
            # newest-first: warm up, then samples
            for _ in range(3):
                newest_first(stub, key, 1)
            firsts, fifties = [], []
            with Profiler(server.pid, args.profile, f"history-newest-first-{size}") as prof:
                for _ in range(samples):
                    first, _ = newest_first(stub, key, 1)
                    firsts.append(first)
                for _ in range(max(10, samples // 3)):
                    _, whole = newest_first(stub, key, 50)
                    fifties.append(whole)
            # cold: the object hibernated (closed) first, by touching more objects than stay open
            colds = []
            path = object_path(server.data_dir, key)

            def touch_fillers() -> None:
                for filler in FILLERS:
                    for _r in stub.GetLatestLeaf(
                        pb.GetLatestLeafRequest(object_key=filler), metadata=routing_metadata(filler)
                    ):
                        pass

            for _ in range(cold_samples):
                if not hibernate(server.pid, path, touch_fillers):
                    log("  warning: the object did not hibernate; cold sample skipped")
                    continue
                first, _ = newest_first(stub, key, 1)
                colds.append(first)
            entry["newest_first_cold_first_ms_p50"] = 1000 * median(colds)
            entry["newest_first_first_ms_p50"] = 1000 * median(firsts)
            entry["newest_first_first_ms_p90"] = 1000 * percentile(firsts, 90)
            entry["newest_first_50_ms_p50"] = 1000 * median(fifties)
            if prof.summary:
                entry["profile_newest_first"] = prof.summary
            # forward streaming vs raw scan, interleaved
            svc_mibs, svc_msgs, raw_mibs = [], [], []
            count = nbytes = 0
            first_id = last_id = ""
            path = object_path(server.data_dir, key)
            with Profiler(server.pid, args.profile, f"history-forward-{size}") as prof:
                for _ in range(reps):
                    count, nbytes, first_id, last_id, seconds = stream_forward(stub, key)
                    svc_mibs.append(nbytes / MIB / seconds)
                    svc_msgs.append(count / seconds)
                    rows, raw_bytes, raw_seconds = raw_scan(path, first_id, last_id)
                    assert rows == count, (rows, count)
                    raw_mibs.append(raw_bytes / MIB / raw_seconds)
            entry.update(
                {
                    "forward_messages": count,
                    "forward_mib": nbytes / MIB,
                    "forward_first_id": first_id,
                    "forward_last_id": last_id,
                    "forward_msgs_per_s": median(svc_msgs),
                    "forward_mib_per_s": median(svc_mibs),
                    "raw_scan_mib_per_s": median(raw_mibs),
                    "forward_vs_raw_scan": median(svc_mibs) / median(raw_mibs),
                }
            )
            if prof.summary:
                entry["profile_forward"] = prof.summary
            results["sizes"][str(size)] = entry
            log(
                f"  {size}: newest-first first p50 {entry['newest_first_first_ms_p50']:.2f} ms; forward "
                f"{count} msgs {entry['forward_mib_per_s']:.1f} MiB/s (raw scan {entry['raw_scan_mib_per_s']:.0f} MiB/s)"
            )
        # RSS while streaming: a fresh server process per transcript (the data stays on disk; the
        # OS page cache is warm from the build), so allocator memory kept from the build does not
        # hide what streaming needs.
        per_message = 20 * 1024
        big_count = max(1, big_mb * 1000 * 1000 // per_message)
        big_key = "history-big"
        rate = build(client, big_key, big_count, per_message, 50, prefix="g")
        log(f"built {big_count} x 20 KB (~{big_mb} MB) in batches of 50: {rate:,.0f} msgs/s")
        rss_while_streaming(server, stub, big_key)  # reads it once (page cache), as the others were
        client.close()
        channel.close()
        server.stop()
        rss: dict[str, Any] = {}
        plan = [(f"{big_mb}MB", big_key)]
        if 10000 in sizes:
            plan.insert(0, ("10MB", "history-10000"))
        for label, key in plan:
            server = ServerProcess(work / "data")
            channel = grpc.insecure_channel(server.address, options=options)
            stub = pb_grpc.SessionServiceStub(channel)
            client = SessionsClient(server.address, options=options)
            with Profiler(server.pid, args.profile, f"history-rss-{label}") as prof:
                rss[label] = rss_while_streaming(server, stub, key)
            if prof.summary:
                rss[f"profile {label}"] = prof.summary
            client.close()
            channel.close()
            server.stop()
        results["rss"] = rss
    finally:
        client.close()
        channel.close()
        server.stop()
        if not args.keep and args.work_dir is None:  # only a temp dir made here
            shutil.rmtree(work, ignore_errors=True)
    results["meta"]["seconds"] = round(time.time() - started, 1)
    report(results, sizes, big_mb)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        log(f"wrote {args.json}")
    return 0


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(results: dict[str, Any], sizes: list[int], big_mb: int) -> None:
    out = print
    s = results["sizes"]
    out("")
    out(
        f"## bench/history.py — {results['meta']['machine']}, Python {results['meta']['python']}"
        f"{' (quick)' if results['meta']['quick'] else ''}, {results['meta']['seconds']} s"
    )
    out("")
    out(
        "| transcript (~1 KB msgs) | newest-first: first msg p50 | first msg, cold object | newest-first: 50 msgs p50 | forward stream: msgs (capped at 10,001) | msgs/s | MiB/s | raw sqlite3 scan MiB/s | stream / raw |"
    )
    out("|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        e = s[str(size)]
        out(
            f"| {size:,} | {e['newest_first_first_ms_p50']:.2f} ms | {e['newest_first_cold_first_ms_p50']:.2f} ms | {e['newest_first_50_ms_p50']:.2f} ms | "
            f"{e['forward_messages']:,} ({e['forward_mib']:.1f} MiB) | {e['forward_msgs_per_s']:,.0f} | "
            f"{e['forward_mib_per_s']:.1f} | {e['raw_scan_mib_per_s']:.0f} | {e['forward_vs_raw_scan']:.3f}x |"
        )
    out("")
    out("| ratio | value | target | verdict |")
    out("|---|---|---|---|")
    lo, hi = str(min(sizes)), str(max(sizes))
    if lo != hi:
        r = s[hi]["newest_first_first_ms_p50"] / s[lo]["newest_first_first_ms_p50"]
        out(
            f"| newest-first first message, {int(hi):,} vs {int(lo):,} msgs | {r:.2f}x | <= 1.5x | {verdict(r <= 1.5)} |"
        )
        results["ratio_newest_first_large_vs_small"] = r
        rc = s[hi]["newest_first_cold_first_ms_p50"] / s[lo]["newest_first_cold_first_ms_p50"]
        out(
            f"| same, cold (hibernated) object | {rc:.2f}x | <= 1.5x (issue 3: cost independent of length) | {verdict(rc <= 1.5)} |"
        )
        results["ratio_newest_first_cold_large_vs_small"] = rc
    for size in sizes:
        e = s[str(size)]
        out(
            f"| forward stream vs raw sqlite3 scan, {size:,} msgs | {e['forward_vs_raw_scan']:.3f}x | (report; issue 11: >= 0.4x) | "
            f"{verdict(e['forward_vs_raw_scan'] >= 0.4)} |"
        )
    rss = results.get("rss", {})
    for label, r in rss.items():
        if label.startswith("profile"):
            continue
        ok = r["growth_mib"] < 100
        out(
            f"| server RSS growth streaming {label} ({r['messages']:,} msgs, {r['transcript_mib']:.0f} MiB) | "
            f"+{r['growth_mib']:.1f} MiB (before {r['rss_before_mib']:.0f}, peak {r['rss_peak_mib']:.0f}, after "
            f"{r['rss_after_mib']:.0f} MiB; {r['seconds']:.1f} s, {r['transcript_mib'] / r['seconds']:.1f} MiB/s) | "
            f"< 100 MiB, flat | {verdict(ok)} |"
        )
    big = rss.get(f"{big_mb}MB")
    small = rss.get("10MB")
    if big and small:
        flat = big["growth_mib"] - small["growth_mib"]
        out(
            f"| RSS growth {big_mb} MB minus 10 MB transcript | {flat:+.1f} MiB | flat (< 100 MiB) | {verdict(flat < 100)} |"
        )
        results["rss_growth_difference_mib"] = flat
    out("")
    for line in (
        "Measured: StreamHistory through the generated stub (default channel options but a 64 MiB receive",
        "limit), one client on loopback, server as a subprocess. Newest-first = time from the call to the first",
        "message, then the stream is cancelled; cold = after the server closed the object by LRU eviction",
        "(--max-open-objects 4, checked in /proc/<pid>/fd). Forward = the whole path root first (at 100,000",
        "messages the depth cap returns the newest 10,001). Raw scan = SELECT content of the same id range",
        "from the object file in this process (OS page cache warm for both). RSS = server VmRSS/VmHWM of a",
        "fresh server process per transcript (before = after start-up; peak while streaming the whole path).",
    ):
        out(line)
    for size in sizes:
        e = s[str(size)]
        for name in ("profile_newest_first", "profile_forward"):
            if name in e:
                out(f"\nprofile {name} {size}:\n{format_profile(e[name])}")
    for label, summary in rss.items():
        if label.startswith("profile"):
            out(f"\n{label} (fresh server, streaming):\n{format_profile(summary)}")


if __name__ == "__main__":
    sys.exit(main())
