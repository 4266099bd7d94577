"""Change-feed numbers for issue 8's closing note. Not collected by pytest.

- Writer throughput: serial AppendMessage calls per second on one object with 0 subscribers and
  with 100 subscribers on that object.
- End-to-end event latency p50/p99: from the start of an AppendMessage call to the moment a
  subscriber has the decoded event, with 1 and with 100 subscribers.

The server runs as a subprocess (its own interpreter, as in production), the 100 subscribers in
four further processes (25 streams each), so client-side decoding does not compete with the writer
or the server for one GIL. Latency is measured by a subscriber thread in the writer's process (one
clock).

    .venv/bin/python -m tests.service.measure_feed [--appends 2000] [--latency-samples 1000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sessions_client import SessionsClient

SUBSCRIBER_PROCESSES = 4


def message(message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": f"event {message_id} " + "x" * 100}]}


def subscriber_process(address: str, key: str, streams: int, ready: Any, results: Any) -> None:
    """`streams` subscriptions on threads; each reports (appends seen, resets seen) at "stop"."""
    client = SessionsClient(address)

    def run() -> None:
        appends = resets = 0
        for event in client.object(key).subscribe(include_progress=True, reconnect_attempts=0):
            if event.type == "progress" and appends == 0 and resets == 0:
                ready.put(1)
            elif event.type == "reset":
                resets += 1
            elif event.type == "append" and event.message is not None:
                if event.message["id"] == "stop":
                    break
                appends += 1
        results.put((appends, resets))

    threads = [threading.Thread(target=run, daemon=True) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()


class Subscribers:
    """`count` subscriptions on `key` in separate processes; ready once every stream started."""

    def __init__(self, address: str, key: str, count: int) -> None:
        ctx = mp.get_context("spawn")
        self.ready, self.results = ctx.Queue(), ctx.Queue()
        self.count = count
        per = [
            count // SUBSCRIBER_PROCESSES + (1 if i < count % SUBSCRIBER_PROCESSES else 0)
            for i in range(SUBSCRIBER_PROCESSES)
        ]
        self.processes = [
            ctx.Process(target=subscriber_process, args=(address, key, n, self.ready, self.results), daemon=True)
            for n in per
            if n
        ]
        for process in self.processes:
            process.start()
        for _ in range(count):
            self.ready.get(timeout=120)

    def finish(self) -> list[tuple[int, int]]:
        out = [self.results.get(timeout=120) for _ in range(self.count)]
        for process in self.processes:
            process.join(timeout=30)
        return out


def write_serially(session: Any, prefix: str, count: int) -> float:
    started = time.perf_counter()
    for i in range(count):
        session.append_message(message(f"{prefix}{i}"))
    return count / (time.perf_counter() - started)


def measure_latency(address: str, session: Any, key: str, samples: int) -> tuple[float, float, float]:
    """(p50, p99, max) in ms of append-start → event decoded by a subscriber in this process."""
    starts: dict[str, float] = {}
    received: queue.Queue[tuple[str, float]] = queue.Queue()
    started = threading.Event()
    client = SessionsClient(address)

    def listen() -> None:
        for event in client.object(key).subscribe(include_progress=True, reconnect_attempts=0):
            now = time.perf_counter()
            if event.type == "progress":
                started.set()
            elif event.type == "append" and event.message is not None:
                received.put((event.message["id"], now))
                if event.message["id"] == f"lat{samples - 1}":
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert started.wait(30)
    latencies = []
    for i in range(samples):
        ident = f"lat{i}"
        starts[ident] = time.perf_counter()
        session.append_message(message(ident))
        got, at = received.get(timeout=30)
        assert got == ident, (got, ident)
        latencies.append((at - starts[ident]) * 1000)
    thread.join(timeout=30)
    client.close()
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))], ordered[-1]


def main() -> None:
    from tests.e2e.conftest import ServerProcess

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=100)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "data").start()
        assert server.proc is not None and server.proc.stdout is not None
        drain = server.proc.stdout
        threading.Thread(target=lambda: [None for _ in drain], daemon=True).start()  # never block on logs
        try:
            with SessionsClient(server.address) as client:
                warm = client.object("warmup").session()
                write_serially(warm, "w", 200)

                quiet = client.object("quiet").session()
                rate0 = write_serially(quiet, "q", args.appends)
                print(f"writer, 0 subscribers:   {rate0:8.0f} appends/s ({args.appends} serial appends)")

                busy_key = "busy"
                busy = client.object(busy_key).session()
                subscribers = Subscribers(server.address, busy_key, args.subscribers)
                rate100 = write_serially(busy, "b", args.appends)
                busy.append_message(message("stop"))
                outcome = subscribers.finish()
                got = sum(a for a, _ in outcome)
                resets = sum(r for _, r in outcome)
                print(
                    f"writer, {args.subscribers} subscribers: {rate100:8.0f} appends/s "
                    f"({rate100 / rate0:.2f}x of 0 subscribers); subscribers received {got} of "
                    f"{args.appends * args.subscribers} events, {resets} resets"
                )
                rate0b = write_serially(quiet, "q2-", args.appends)
                print(f"writer, 0 subscribers (again): {rate0b:8.0f} appends/s")

                p50, p99, worst = measure_latency(
                    server.address, client.object("lat1").session(), "lat1", args.latency_samples
                )
                print(f"latency, 1 subscriber:    p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  max {worst:6.2f} ms")

                many = Subscribers(server.address, "lat100", args.subscribers - 1)
                p50, p99, worst = measure_latency(
                    server.address, client.object("lat100").session(), "lat100", args.latency_samples
                )
                client.object("lat100").session().append_message(message("stop"))
                many.finish()
                print(
                    f"latency, {args.subscribers} subscribers: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms"
                    f"  max {worst:6.2f} ms"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
