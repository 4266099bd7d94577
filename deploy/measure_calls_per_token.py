#!/usr/bin/env python3
"""What nginx's calls-per-token bound (deploy/nginx/nginx.conf, `limit_conn calls_per_token`)
does for a light tenant beside a heavy one, measured on this machine.

One shard with a tokens file, behind several nginx instances from the shipped configuration that
differ only in the bound (none, and each of --bounds). In each phase tenant B appends a small
message and reads its last 20, then pauses 20 ms, in a loop, first alone, then while tenant A
runs 128 concurrent 2 KB appends over 200 objects through the same nginx (in another process,
backing off on refusals as the clients do). Phases alternate between the instances, in reverse
order every other round, so that all meet the same phases of the machine.

Run from the repository root (needs Debian's nginx):
    .venv/bin/python deploy/measure_calls_per_token.py [--rounds 2] [--seconds 12] [--bounds 16,32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import grpc
import grpc.aio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.deploy.support import Proxy, Shard, free_port  # noqa: E402
from tests.security.tenants import tenant_tokens  # noqa: E402

from sessions_proto.v1 import sessions_pb2 as pb  # noqa: E402
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc  # noqa: E402

HEAVY_CALLS = 128


def _metadata(tenant: str, key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {tenant}-secret"), ("x-object-key", urllib.parse.quote(key, safe=""))]


def _message(message_id: str, text: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})


async def heavy_tenant(address: str, seconds: float) -> dict[str, int]:
    """Tenant A: HEAVY_CALLS appends in flight at all times, on 4 connections."""
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(4)]
    stubs = [pb_grpc.SessionServiceStub(channel) for channel in channels]
    counts = {"appended": 0, "refused": 0}
    end = time.monotonic() + seconds

    async def appender(n: int) -> None:
        stub, i, failures = stubs[n % 4], 0, 0
        while time.monotonic() < end:
            key = f"tenant-a/heavy{(n * 7 + i) % 200}"
            request = pb.AppendMessageRequest(object_key=key, message_json=_message(f"{n}-{i}", "y" * 2000))
            try:
                await stub.AppendMessage(request, metadata=_metadata("a", key))
                counts["appended"] += 1
                failures, i = 0, i + 1
            except grpc.RpcError:
                counts["refused"] += 1
                failures += 1  # the clients' backoff: 50 ms doubling to 2 s, jittered
                await asyncio.sleep(random.uniform(0.5, 1.0) * min(2.0, 0.05 * 2 ** (failures - 1)))

    await asyncio.gather(*(appender(n) for n in range(HEAVY_CALLS)))
    for channel in channels:
        await channel.close()
    return counts


def light_tenant(address: str, seconds: float) -> dict[str, float]:
    """Tenant B's loop; its append and read latencies' median and 99th percentile, in ms."""
    key = "tenant-b/light"
    appends: list[float] = []
    reads: list[float] = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            request = pb.AppendMessageRequest(object_key=key, message_json=_message(f"b{time.time_ns()}", "light"))
            stub.AppendMessage(request, metadata=_metadata("b", key), timeout=30)
            appends.append(time.perf_counter() - started)
            started = time.perf_counter()
            history = pb.StreamHistoryRequest(object_key=key, newest_first=True, max_messages=20)
            list(stub.StreamHistory(history, metadata=_metadata("b", key), timeout=30))
            reads.append(time.perf_counter() - started)
            time.sleep(0.02)

    def ms(values: list[float], q: int) -> float:
        return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000, 1)

    return {
        "append_p50": ms(appends, 50),
        "append_p99": ms(appends, 99),
        "read_p50": ms(reads, 50),
        "read_p99": ms(reads, 99),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--bounds", default="16,32", help="calls per token of the bounded instances")
    parser.add_argument("--heavy", nargs=2, metavar=("ADDRESS", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.heavy:
        print(json.dumps(asyncio.run(heavy_tenant(args.heavy[0], float(args.heavy[1])))))
        return 0
    work = Path(tempfile.mkdtemp(prefix="sessions-calls-per-token-"))
    tokens = tenant_tokens(work / "tokens.json", ["a", "b"])
    shard = Shard("shard", work / "shard", free_port(), "--tokens-file", str(tokens)).start()
    bounds = [0, *(int(bound) for bound in args.bounds.split(","))]
    proxies: dict[int, Proxy] = {}
    rows = []
    try:
        for bound in bounds:
            # 0 stands for no bound: more calls than the heavy tenant ever has in flight.
            proxies[bound] = Proxy(
                "nginx", work / f"nginx-{bound}", free_port(), [shard.address], calls_per_token=bound or 65_535
            ).start()
        for round_ in range(args.rounds):
            for bound in bounds if round_ % 2 == 0 else bounds[::-1]:
                address = proxies[bound].address
                alone = light_tenant(address, args.seconds / 3)
                heavy = subprocess.Popen(
                    [sys.executable, __file__, "--heavy", address, str(args.seconds + 2)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                time.sleep(1.5)  # the heavy tenant's calls under way
                beside = light_tenant(address, args.seconds)
                out, _ = heavy.communicate(timeout=args.seconds + 60)
                row = {"round": round_, "bound": bound or None, "alone": alone, "beside": beside}
                row["heavy"] = json.loads(out.strip().splitlines()[-1])
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        shard.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
