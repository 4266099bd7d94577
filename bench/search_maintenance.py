"""Writes to an object whose search index is large: update, delete and append latency.

    python bench/search_maintenance.py [--messages 100000] [--samples 20]

Against a `sessions-server` subprocess on loopback (fresh data directory): one session of
`--messages` messages of ~1 KB (AppendMessages, 2,000 a call), one search to build the index,
then `--samples` rounds of an UpdateMessage (new text), a DeleteMessages of one message and an
AppendMessage, each timed alone; p50 of each. Upstream's maintenance reads the whole index for
an update or a delete, so those grew with the object's size; the append shows what the index
costs every write. To compare two commits, run this from each checkout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from common import ServerProcess, median

from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc

KEY = "search-maintenance"
BATCH = 2000


def message_json(index: int, text: str | None = None) -> str:
    body = text if text is not None else f"lorem ipsum message number {index} " + "x" * 900
    return json.dumps({"id": f"m{index}", "role": "user", "parts": [{"type": "text", "text": body}]})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    metadata = routing_metadata(KEY)
    with tempfile.TemporaryDirectory(prefix="search-maintenance-") as work:
        server = ServerProcess(Path(work) / "data")
        try:
            channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 64 << 20)])
            stub = pb_grpc.SessionServiceStub(channel)
            started = time.perf_counter()
            for first in range(0, args.messages, BATCH):
                items = [
                    pb.AppendItem(message_json=message_json(i)) for i in range(first, min(args.messages, first + BATCH))
                ]
                stub.AppendMessages(
                    pb.AppendMessagesRequest(object_key=KEY, items=items, omit_json_as_sent=True), metadata=metadata
                )
            built = time.perf_counter()
            list(stub.SearchMessages(pb.SearchMessagesRequest(object_key=KEY, query="lorem"), metadata=metadata))
            indexed = time.perf_counter()
            updates, deletes, appends = [], [], []
            for sample in range(args.samples):
                target = (sample * 7919) % args.messages
                t = time.perf_counter()
                stub.UpdateMessage(
                    pb.UpdateMessageRequest(object_key=KEY, message_json=message_json(target, f"changed {sample}")),
                    metadata=metadata,
                )
                updates.append(time.perf_counter() - t)
                t = time.perf_counter()
                stub.DeleteMessages(
                    pb.DeleteMessagesRequest(object_key=KEY, message_ids=[f"m{(target + 1) % args.messages}"]),
                    metadata=metadata,
                )
                deletes.append(time.perf_counter() - t)
                t = time.perf_counter()
                stub.AppendMessage(
                    pb.AppendMessageRequest(
                        object_key=KEY, message_json=message_json(args.messages + sample), omit_json_as_sent=True
                    ),
                    metadata=metadata,
                )
                appends.append(time.perf_counter() - t)
            channel.close()
        finally:
            server.stop()
    print(
        f"{args.messages:,} messages: written in {built - started:.1f} s, indexed by the first search in "
        f"{indexed - built:.1f} s; p50 of {args.samples}: update {1000 * median(updates):.1f} ms, "
        f"delete {1000 * median(deletes):.1f} ms, append {1000 * median(appends):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
