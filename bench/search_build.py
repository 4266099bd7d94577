"""The first search of a large object: how long it takes, and what it costs the object's writes.

    python bench/search_build.py [--messages 100000]

Against a `sessions-server` subprocess on loopback (fresh data directory): one session of
`--messages` messages of ~1 KB (AppendMessages, 2,000 a call), then, while the first search builds
the object's index, an append to another session of the same object every 10 ms. Reports the
first search's time and the appends' median and worst latency: the object's writes wait for
the build (in steps of about 50 ms), so the worst is what a conversation meets while another
session's history is indexed. To compare two commits, run this from each checkout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from common import ServerProcess

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc

KEY = "search-build"
BATCH = 2000


def message_json(message_id: str, text: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    metadata = routing_metadata(KEY)
    latencies: list[float] = []
    with tempfile.TemporaryDirectory(prefix="search-build-") as work:
        server = ServerProcess(Path(work) / "data")
        try:
            channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 64 << 20)])
            stub = pb_grpc.SessionServiceStub(channel)
            for first in range(0, args.messages, BATCH):
                items = [
                    pb.AppendItem(message_json=message_json(f"m{i}", f"lorem {i} " + "x" * 900))
                    for i in range(first, min(args.messages, first + BATCH))
                ]
                request = pb.AppendMessagesRequest(
                    object_key=KEY, session_id="big", items=items, omit_json_as_sent=True
                )
                stub.AppendMessages(request, metadata=metadata)
            stop = threading.Event()

            def append_meanwhile() -> None:
                count = 0
                while not stop.is_set():
                    count += 1
                    text = message_json(f"p{count}", "hi")
                    request = pb.AppendMessageRequest(
                        object_key=KEY, session_id="chat", message_json=text, omit_json_as_sent=True
                    )
                    started = time.perf_counter()
                    stub.AppendMessage(request, metadata=metadata)
                    latencies.append(time.perf_counter() - started)
                    stop.wait(0.01)

            appender = threading.Thread(target=append_meanwhile)
            appender.start()
            started = time.perf_counter()
            search = pb.SearchMessagesRequest(object_key=KEY, session_id="big", query="lorem")
            list(stub.SearchMessages(search, metadata=metadata, timeout=3600))
            build = time.perf_counter() - started
            stop.set()
            appender.join()
            channel.close()
        finally:
            server.stop()
    print(
        f"{args.messages:,} messages: first search {build:.2f} s; appends to the object meanwhile: "
        f"{len(latencies)}, p50 {1000 * statistics.median(latencies):.1f} ms, max {1000 * max(latencies):.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
