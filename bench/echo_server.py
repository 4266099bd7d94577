"""The bare gRPC baseline: a grpc.aio server that does nothing but answer, with no proto.

Methods (raw bytes, generic handlers, same server options and event loop as the Sessions server's
defaults: uvloop when installed):
  /bench.Echo/Echo     unary: answers the request bytes
  /bench.Echo/Stream   server streaming: request is `COUNT SIZE` (ASCII); answers COUNT frames of SIZE bytes
  /bench.Echo/Commit   unary: stores the request bytes as one row in a durable SQLite commit on a
                       worker thread (WAL, synchronous=FULL, 16 KiB pages), then answers them: a
                       durable write through grpc.aio with no service logic (with --commit-file)

    python bench/echo_server.py --listen 127.0.0.1:0 [--commit-file F]   # prints `echo listening on 127.0.0.1:PORT`
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

ECHO = "/bench.Echo/Echo"
STREAM = "/bench.Echo/Stream"
COMMIT = "/bench.Echo/Commit"


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    count_text, size_text = request.decode().split()
    frame = b"x" * int(size_text)
    for _ in range(int(count_text)):
        yield frame


def committer(path: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """The Commit handler: one writer thread and connection, as the service has per object."""
    from common import raw_store  # the bench's raw-SQLite settings (bench/ is this script's directory)

    writer = ThreadPoolExecutor(max_workers=1)
    conn = writer.submit(raw_store, Path(path)).result()
    conn.execute("CREATE TABLE IF NOT EXISTS echo_rows (n INTEGER PRIMARY KEY, body BLOB NOT NULL)")

    def store(body: bytes) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO echo_rows (body) VALUES (?)", (body,))
        conn.execute("COMMIT")

    async def commit(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.get_running_loop().run_in_executor(writer, store, request)
        return request

    return commit


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--commit-file", help="SQLite file for the Commit method (absent: no Commit method)")
    args = parser.parse_args()
    methods: dict[str, grpc.RpcMethodHandler] = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    }
    if args.commit_file:
        methods["Commit"] = grpc.unary_unary_rpc_method_handler(committer(args.commit_file))
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    handler = grpc.method_handlers_generic_handler("bench.Echo", methods)
    server.add_generic_rpc_handlers((handler,))
    host = args.listen.rsplit(":", 1)[0]
    port = server.add_insecure_port(args.listen)
    await server.start()
    print(f"echo listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


if __name__ == "__main__":
    # The event loop `sessions-server serve` picks by default, so the baseline's transport costs
    # what the service's does.
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
