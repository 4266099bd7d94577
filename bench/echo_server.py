"""The bare gRPC baseline: a grpc.aio server that does nothing but answer, with no proto.

Methods (raw bytes, generic handlers, same server options as the Sessions server's defaults):
  /bench.Echo/Echo     unary: answers the request bytes
  /bench.Echo/Stream   server streaming: request is `COUNT SIZE` (ASCII); answers COUNT frames of SIZE bytes

    python bench/echo_server.py --listen 127.0.0.1:0      # prints `echo listening on 127.0.0.1:PORT`
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc

ECHO = "/bench.Echo/Echo"
STREAM = "/bench.Echo/Stream"


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    count_text, size_text = request.decode().split()
    frame = b"x" * int(size_text)
    for _ in range(int(count_text)):
        yield frame


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
    )
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
    asyncio.run(main())
