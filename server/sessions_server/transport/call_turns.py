"""Turns of one token's unary calls: at most so many run at once, the rest wait their turn.

Every call shares one event loop and one pool of SQL threads, served first come, first served.
A tenant with 128 appends in flight made another tenant's lone append wait behind all of them
(280 ms where it took 5, in the multi-tenant audit; its reads 30 times their usual p99). A
token's calls beyond `per_token` wait here, in its own queue and in order, before any of their
work starts; another token's call goes in at once, behind a bounded number of others'. Nothing
is refused: a waiting call ends only with its deadline or its caller. Without tokens there is
no one to tell apart, and every call goes in.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator


class CallTurns:
    """How many calls each token (an opaque id) runs at once, and who waits for a turn."""

    def __init__(self, per_token: int) -> None:
        self.per_token = per_token  # 0: no bound
        self._running: dict[str, int] = {}
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}

    @property
    def waiting(self) -> int:
        """Calls waiting for their token's turn, all tokens together."""
        return sum(len(queue) for queue in self._waiting.values())

    def running(self, token: str) -> int:
        return self._running.get(token, 0)

    @contextlib.asynccontextmanager
    async def turn(self, token: str | None) -> AsyncIterator[None]:
        """Runs the block in `token`'s turn: at once while it runs fewer than `per_token` calls
        and none of its calls waits, else after the calls of it that came first."""
        if token is None or not self.per_token:
            yield
            return
        if self._running.get(token, 0) < self.per_token and token not in self._waiting:
            self._running[token] = self._running.get(token, 0) + 1
        else:
            await self._wait(token)
        try:
            yield
        finally:
            self._pass_on(token)

    async def _wait(self, token: str) -> None:
        queue = self._waiting.setdefault(token, collections.deque())
        granted = asyncio.get_running_loop().create_future()
        queue.append(granted)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():  # its turn came as it left: the next one's
                self._pass_on(token)
            elif granted in queue:  # not passed over yet (see _pass_on)
                queue.remove(granted)
                if not queue:
                    del self._waiting[token]
            raise

    def _pass_on(self, token: str) -> None:
        """A call of `token` ends: its turn goes to the first of the token's waiting calls (the
        count of running calls stays), else the count drops."""
        queue = self._waiting.get(token)
        while queue:
            granted = queue.popleft()
            if not queue:
                del self._waiting[token]
            if not granted.done():  # else cancelled, its caller not yet told: it removes nothing then
                granted.set_result(None)
                return
        left = self._running[token] - 1
        if left:
            self._running[token] = left
        else:
            del self._running[token]
