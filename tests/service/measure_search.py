"""Search latency on a large object (issue 7's closing-note numbers). Not collected by pytest.

Builds an object of 100,000 messages (AppendMessages in batches of 1,000) on an in-process server
with a temporary data directory, then times the first search (which creates and backfills the
index) and the p50/p95 of 20 further searches per query shape.

    .venv/bin/python -m tests.service.measure_search [--messages 100000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from sessions_client import SessionsClient
from tests.conftest import start_server

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "deploy",
    "server",
    "client",
    "message",
    "session",
    "search",
    "index",
    "query",
    "result",
    "agent",
    "tool",
    "model",
    "prompt",
    "token",
    "summary",
    "history",
    "branch",
    "overlay",
    "attachment",
    "image",
    "stream",
    "feed",
    "revision",
]


def build_text(rng: random.Random, index: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 40))]
    return f"message {index} " + " ".join(words)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "data")
        try:
            with SessionsClient(server.address) as client:
                session = client.object("measure-search").session()
                started = time.perf_counter()
                for start in range(0, args.messages, args.batch):
                    count = min(args.batch, args.messages - start)
                    session.append_messages(
                        [
                            {
                                "id": f"m{i:06d}",
                                "role": "user" if i % 2 else "assistant",
                                "parts": [{"type": "text", "text": build_text(rng, i)}],
                            }
                            for i in range(start, start + count)
                        ]
                    )
                build = time.perf_counter() - started
                print(f"built {args.messages:,} messages in {build:.1f} s ({args.messages / build:,.0f} msg/s)")

                started = time.perf_counter()
                first = session.search("alpha beta")
                backfill = time.perf_counter() - started
                print(f"first search (creates + backfills the index): {backfill * 1000:.0f} ms, {len(first)} hits")

                queries = [
                    ("rare phrase", "message 4242", "phrase", 20),
                    ("common word", "alpha", "phrase", 20),
                    ("common phrase", "alpha beta", "phrase", 20),
                    ("all words", "omega deploy summary", "all_words", 20),
                    ("common word, limit 1000", "alpha", "phrase", 1000),
                    ("no match", "nonexistentword", "phrase", 20),
                ]
                for label, query, mode, limit in queries:
                    samples = []
                    hits = 0
                    for _ in range(args.repeats):
                        started = time.perf_counter()
                        hits = len(session.search(query, mode=mode, limit=limit))
                        samples.append(time.perf_counter() - started)
                    print(
                        f"{label:26s} p50 {statistics.median(samples) * 1000:7.1f} ms"
                        f"  p95 {percentile(samples, 0.95) * 1000:7.1f} ms  ({hits} hits)"
                    )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
