"""Work for a server gone quiet: an action that runs once the calls stop, not while they come.

A server that has just handled a burst of large messages holds freed memory for the next one;
once nothing has started for a while, it can hand that back (see `allocator.release_free_heap`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from sessions_server.transport.metrics import CallMeter

log = logging.getLogger("sessions.server")


class IdleWatch:
    """Looked at periodically with the count of calls started so far and the count in flight:
    says "idle now" once per quiet spell, the first time it finds no call started since its last
    look and none in flight, and only after some call since it last said so (a server that was
    never busy, or is still quiet, has nothing new to give back)."""

    def __init__(self) -> None:
        self._seen = 0
        self._acted_at = 0

    def idle_now(self, started: int, in_flight: int) -> bool:
        quiet = started == self._seen and in_flight == 0
        self._seen = started
        if quiet and started != self._acted_at:
            self._acted_at = started
            return True
        return False


async def run_when_idle(calls: CallMeter, every_seconds: float, action: Callable[[], bool], executor: Executor) -> None:
    """Runs `action` on `executor` (off the event loop) each time the server goes idle; its
    result says whether it did anything, for the log. Runs until cancelled, which the server
    does before it shuts the executor down."""
    watch = IdleWatch()
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_seconds)
        if watch.idle_now(calls.calls_started, calls.calls_in_flight):
            did = await loop.run_in_executor(executor, action)
            log.debug("idle: %s", "released free heap memory" if did else "no free heap memory to release")
