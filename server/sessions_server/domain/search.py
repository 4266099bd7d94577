"""Full-text search: turning a user's query into an FTS5 expression that cannot inject syntax.

Upstream quotes the whole query as one phrase, so FTS operators, column filters, `NEAR(` and `*`
are literal text and words must be adjacent and in order. The all-words mode (beyond upstream)
quotes each whitespace-separated word as its own phrase; FTS5 ANDs them, in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.errors import InvalidArgument
from sessions_server.domain.limits import busy
from sessions_server.storage import queries

T = TypeVar("T")

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
MAX_QUERY_BYTES = 4096
DEFAULT_SEARCH_SECONDS = 2.0  # a search's budget: its wait for a slot, then its run
# Half the server's SQL threads (8): a search may run for its whole budget on one, and the other
# half stay free for every other call.
DEFAULT_CONCURRENT_SEARCHES = 4
PHRASE = "phrase"
ALL_WORDS = "all_words"


@dataclass(frozen=True, slots=True)
class SearchHit:
    id: str
    role: str
    session_id: str
    content: str


MAX_QUERY_WORDS = 32
# Tokens the index's tokenizer finds in a query (runs of letters and digits), in either mode.
# FTS5 matches a phrase in time that grows with its tokens times their occurrences in a row,
# inside SQLite, where the search's deadline cannot stop it: a phrase of 2,048 times "a" over
# one message of 300,000 "a"s held a SQL thread (and with one search slot, every search) for
# 15.6 s past a 2 s budget; one word of the all-words mode ("a-a-a-...") did the same. 64 takes
# 0.09 s over that message.
MAX_QUERY_TOKENS = 64


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def fts_expression(query: str, mode: str, *, max_query_bytes: int = MAX_QUERY_BYTES) -> str | None:
    """The MATCH expression for a query, or None when it can match nothing (empty)."""
    if "\x00" in query:
        raise InvalidArgument("query must not contain NUL characters", field="query")
    size = utf8_length(query)
    if size > max_query_bytes:
        raise InvalidArgument(
            f"query is {size} bytes; the limit is {max_query_bytes} bytes (max_query_bytes)",
            reason="LIMIT_EXCEEDED",
            field="query",
            limit="max_query_bytes",
            limit_value=str(max_query_bytes),
        )
    if mode == PHRASE:
        _check_tokens(query)
        return _quote(query)
    # A word twice means nothing more, and FTS5 matches many words that name one token in time
    # that grows with their count squared, inside SQLite where the search's deadline cannot stop
    # it: 2,048 times "a" over one message of 5,000 "a"s ran 47 s, past a 2 s budget.
    words = list(dict.fromkeys(query.split()))
    if not words:
        return None
    if len(words) > MAX_QUERY_WORDS:
        raise InvalidArgument(
            f"query has {len(words)} different words; the limit is {MAX_QUERY_WORDS} in all_words mode "
            "(max_query_words)",
            reason="LIMIT_EXCEEDED",
            field="query",
            limit="max_query_words",
            limit_value=str(MAX_QUERY_WORDS),
        )
    _check_tokens(" ".join(words))
    return " ".join(_quote(word) for word in words)


def count_tokens(text: str) -> int:
    """Tokens as the index's tokenizer finds them (FTS5's own count, `queries.count_index_tokens`):
    runs of letters, digits and private-use characters, some combining accents joining the run
    they follow, other marks separating words as a space does, as its Unicode tables have them."""
    return queries.count_index_tokens(text)


def _check_tokens(query: str) -> None:
    tokens = count_tokens(query)
    if tokens > MAX_QUERY_TOKENS:
        raise InvalidArgument(
            f"query has {tokens} words to match (runs of letters and digits, a repeated one counting each "
            f"time in a phrase); the limit is {MAX_QUERY_TOKENS} (max_query_tokens)",
            reason="LIMIT_EXCEEDED",
            field="query",
            limit="max_query_tokens",
            limit_value=str(MAX_QUERY_TOKENS),
        )


def effective_limit(limit: int | None) -> int:
    """None means upstream's default of 20; 0 returns nothing (SQLite's LIMIT 0, as upstream);
    negative means no limit upstream, the cap here; larger values are capped."""
    if limit is None:
        return DEFAULT_LIMIT
    if limit < 0:
        return MAX_LIMIT
    return min(limit, MAX_LIMIT)


@dataclass(eq=False)
class _Waiter:
    tenant: str | None
    granted: asyncio.Future[None]


class SearchSlots:
    """How many searches run at once, process-wide. A search holds a SQL thread for up to its
    budget, so without a bound a burst of them takes every thread and stalls other tenants'
    appends and reads; the searches beyond it wait, within their own budget.

    The waiting is fair across tenants (the caller's token, an opaque string; None without
    tokens): a slot that frees goes to the waiter whose tenant has the fewest searches running,
    then to the tenant served least recently, then to the first come. In one queue for all, a
    tenant's 1 ms search waited behind every heavy search another tenant had queued (seconds,
    or its whole budget, refused). A tenant holding slots gets no more of them while others
    wait: a free slot is taken at once only when nobody waits. Without tokens, first come,
    first served."""

    def __init__(self, limit: int = DEFAULT_CONCURRENT_SEARCHES) -> None:
        self.limit = max(1, limit)
        self.running = 0
        self._waiters: list[_Waiter] = []  # in order of arrival
        self._running_by: dict[str | None, int] = {}
        # When each tenant with searches running or waiting was last given a slot (a count):
        # with one slot, "fewest running" ties at every turn, and the tenant whose search just
        # ended would get it again.
        self._served_at: dict[str | None, int] = {}
        self._grants = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def taken(self, deadline: float, tenant: str | None = None) -> AsyncIterator[SearchSlot]:
        """A slot, waited for until the monotonic `deadline` (the search's budget): past it,
        LimitExceeded with SERVER_BUSY, which clients retry. The search's SQL runs through the
        slot's `run`, which keeps the slot taken until that SQL has ended, even when the caller
        gave up on it first."""
        if self.running < self.limit and not self._waiters:
            self._grant(tenant)
        else:
            await self._wait(deadline, tenant)
        slot = SearchSlot(lambda: self._give_back(tenant))
        try:
            yield slot
        finally:
            slot.leave()

    async def _wait(self, deadline: float, tenant: str | None) -> None:
        waiter = _Waiter(tenant, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await asyncio.shield(waiter.granted)
        except BaseException as exc:
            if waiter.granted.done():  # given a slot as the wait ended: it goes to the next
                self._give_back(tenant)
            else:
                self._waiters.remove(waiter)
                self._forget(tenant)
            if isinstance(exc, TimeoutError):
                raise busy(
                    f"{self.limit} searches were running (max_concurrent_searches) for this search's whole "
                    "budget; retry shortly",
                    "max_concurrent_searches",
                    self.limit,
                ) from None
            raise

    def _grant(self, tenant: str | None) -> None:
        self.running += 1
        self._running_by[tenant] = self._running_by.get(tenant, 0) + 1
        self._grants += 1
        self._served_at[tenant] = self._grants

    def _give_back(self, tenant: str | None) -> None:
        self.running -= 1
        left = self._running_by[tenant] - 1
        if left:
            self._running_by[tenant] = left
        else:
            del self._running_by[tenant]
        if self._waiters:
            waiter = min(
                enumerate(self._waiters),
                key=lambda item: (
                    self._running_by.get(item[1].tenant, 0),
                    self._served_at.get(item[1].tenant, 0),
                    item[0],
                ),
            )[1]
            self._waiters.remove(waiter)
            self._grant(waiter.tenant)
            waiter.granted.set_result(None)
        self._forget(tenant)

    def _forget(self, tenant: str | None) -> None:
        """Drops what is kept of a tenant with no search running or waiting (a new tenant then)."""
        if tenant not in self._running_by and all(waiter.tenant != tenant for waiter in self._waiters):
            self._served_at.pop(tenant, None)


class SearchSlot:
    """One taken slot. A cancelled caller cannot stop a query on its SQL thread (the deadline's
    progress handler is not reached inside some FTS5 work), so a slot whose query still runs is
    given back when the query ends, not when its caller leaves: the bound is on SQL threads."""

    def __init__(self, give_back: Callable[[], None]) -> None:
        self._give_back: Callable[[], None] | None = give_back
        self._running: asyncio.Future[Any] | None = None

    async def run(self, work: Awaitable[T]) -> T:
        self._running = asyncio.ensure_future(work)
        try:
            return await asyncio.shield(self._running)
        finally:
            if self._running.done():
                self._running = None

    def leave(self) -> None:
        running = self._running
        if running is None:
            self._release()
            return
        # The caller left while the query runs on: the query's end gives the slot back, and its
        # outcome, which no one waits for now, is taken so that asyncio does not report it.
        running.add_done_callback(self._after_abandoned)

    def _after_abandoned(self, running: asyncio.Future[Any]) -> None:
        if not running.cancelled():
            running.exception()
        self._release()

    def _release(self) -> None:
        give_back, self._give_back = self._give_back, None
        if give_back is not None:
            give_back()
