#!/usr/bin/env python3
"""Issue 12's closing figures, measured on this machine:

- throughput of 1 KB appends on 4 objects, direct to a shard vs through nginx and HAProxy (the
  shipped configurations), alternated in rounds in the same run;
- the time to move a 100 MB object between two shards with `sessions-server move-object`.

Run from the repository root (needs Debian's nginx and haproxy):
    .venv/bin/python deploy/measure_proxy.py [--rounds 4] [--round-seconds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.deploy.support import Proxy, Shard, free_port, text_message  # noqa: E402

from sessions_client import SessionsClient  # noqa: E402
from sessions_server.storage.paths import object_path  # noqa: E402

KB_TEXT = "x" * 1000


def append_rate(address: str, seconds: float, tag: str) -> float:
    keys = [f"tput/{i}" for i in range(4)]
    done = 0
    with SessionsClient(address) as client:
        sessions = [client.object(key).session() for key in keys]
        sessions[0].append_message(text_message(f"{tag}-warm", KB_TEXT))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sessions[done % 4].append_message(text_message(f"{tag}-{done}", KB_TEXT))
            done += 1
    return done / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--round-seconds", type=float, default=5.0)
    parser.add_argument("--move-mb", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sessions-proxy-"))
    shard = Shard("shard", work / "shard", free_port())
    other = Shard("other", work / "other", free_port())
    nginx = Proxy("nginx", work / "nginx", free_port(), [])
    haproxy = Proxy("haproxy", work / "haproxy", free_port(), [])
    report: dict[str, object] = {}
    try:
        shard.start()
        other.start()
        nginx.servers = haproxy.servers = [shard.address]
        nginx.start()
        haproxy.start()
        rates: dict[str, list[float]] = {"direct": [], "nginx": [], "haproxy": []}
        targets = {"direct": shard.address, "nginx": nginx.address, "haproxy": haproxy.address}
        for r in range(args.rounds):
            order = list(targets) if r % 2 == 0 else list(reversed(targets))
            for name in order:
                rates[name].append(append_rate(targets[name], args.round_seconds, f"{name}{r}"))
        medians = {name: round(statistics.median(values), 1) for name, values in rates.items()}
        report["appends_per_s_1kb_4_objects"] = medians
        report["ratio_nginx_over_direct"] = round(medians["nginx"] / medians["direct"], 3)
        report["ratio_haproxy_over_direct"] = round(medians["haproxy"] / medians["direct"], 3)
        print(json.dumps(report), flush=True)

        # A 100 MB object: 20 MB messages (client-streamed uploads), then one move.
        with SessionsClient(shard.address) as client:
            session = client.object("big/object").session()
            for i in range(args.move_mb // 20):
                session.append_message(text_message(f"big{i}", f"{i}" * (20 * 1024 * 1024)))
        size = object_path(shard.data_dir, "big/object").stat().st_size
        started = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "sessions_server.cli",
                "move-object",
                "--from",
                shard.address,
                "--to",
                other.address,
                "--object-key",
                "big/object",
            ],
            check=True,
            capture_output=True,
        )
        report["move"] = {"object_file_mb": round(size / 1e6, 1), "seconds": round(time.monotonic() - started, 2)}
        print(json.dumps(report["move"]), flush=True)
    finally:
        nginx.stop()
        haproxy.stop()
        shard.stop()
        other.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
