"""Pointer mode vs inline reads (issue 5's closing-note numbers). Not collected by pytest.

Builds one session of 50 messages on an in-process server with a temporary data directory; twenty
of them hold a distinct 2 MB image. Then reads the history with StreamHistory inline and in pointer
mode, counting the protobuf bytes of every response frame (what crosses the wire, before HTTP/2
framing) and the wall time of a full read, both through a stock stub (default 4 MiB receive limit)
and through the Python client's `get_history`.

    .venv/bin/python -m tests.service.measure_pointer_mode [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from sessions_client import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from tests.conftest import start_server
from tests.service.test_attachments import b64

MESSAGES = 50
IMAGES = 20
IMAGE_BYTES = 2_000_000
KEY = "measure-pointer-mode"


def build(session: object, rng: random.Random) -> int:
    image_every = MESSAGES // IMAGES  # every other message holds one image up to twenty
    images = 0
    for index in range(MESSAGES):
        parts: list[dict[str, object]] = [{"type": "text", "text": f"message {index}: " + "words " * 40}]
        if index % image_every == 1 and images < IMAGES:
            data = rng.randbytes(IMAGE_BYTES)
            parts.append({"type": "file", "mediaType": "image/png", "url": f"data:image/png;base64,{b64(data)}"})
            images += 1
        role = "user" if index % 2 == 0 else "assistant"
        session.append_message({"id": f"m{index:02d}", "role": role, "parts": parts})  # type: ignore[attr-defined]
    return images


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    samples = []
    result: object = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "data")
        try:
            with SessionsClient(server.address) as client:
                session = client.object(KEY).session()
                images = build(session, random.Random(5))
                stats = client.object(KEY).get_object_stats()
                print(
                    f"session: {MESSAGES} messages, {images} images of {IMAGE_BYTES:,} bytes; "
                    f"attachments stored: {stats.attachment_count} ({stats.attachment_bytes:,} bytes), "
                    f"file {stats.file_bytes:,} bytes"
                )
                channel = grpc.insecure_channel(server.address)  # stock options: 4 MiB receive limit
                stub = sessions_pb2_grpc.SessionServiceStub(channel)

                def raw(mode: int) -> Callable[[], tuple[int, int, int]]:
                    def read() -> tuple[int, int, int]:
                        request = pb.StreamHistoryRequest(object_key=KEY, attachments=mode)
                        frames = total = largest = 0
                        for response in stub.StreamHistory(request, metadata=(("x-object-key", KEY),)):
                            size = response.ByteSize()
                            frames += 1
                            total += size
                            largest = max(largest, size)
                        return frames, total, largest

                    return read

                rows = []
                for name, mode, pointers in (
                    ("inline", pb.ATTACHMENT_MODE_INLINE, False),
                    ("pointers", pb.ATTACHMENT_MODE_POINTER, True),
                ):
                    raw_seconds, (frames, total, largest) = timed(raw(mode), args.repeats)  # type: ignore[misc]
                    client_seconds, messages = timed(
                        lambda p=pointers: session.get_history(pointers=p),
                        args.repeats,  # type: ignore[misc]
                    )
                    assert len(messages) == MESSAGES  # type: ignore[arg-type]
                    rows.append((name, frames, total, largest, raw_seconds, client_seconds))
                channel.close()
        finally:
            server.stop()

    print(f"median of {args.repeats} full reads of the session (StreamHistory):")
    print(f"{'mode':<9} {'frames':>6} {'bytes':>14} {'largest frame':>14} {'stub s':>8} {'client s':>9}")
    for name, frames, total, largest, raw_seconds, client_seconds in rows:
        print(f"{name:<9} {frames:>6} {total:>14,} {largest:>14,} {raw_seconds:>8.3f} {client_seconds:>9.3f}")
    inline, pointers = rows
    print(
        f"pointer mode: {inline[2] / pointers[2]:,.0f}x fewer bytes, "
        f"{inline[4] / pointers[4]:,.1f}x faster (stub), {inline[5] / pointers[5]:,.1f}x faster (client)"
    )


if __name__ == "__main__":
    main()
