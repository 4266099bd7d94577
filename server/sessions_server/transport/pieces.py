"""Messages the server holds while they arrive or are written, within bounds.

A message sent in pieces (UploadMessage, ImportMessages) has no size of its own until its last
piece, so the server holds what has come so far. Two bounds keep that from exhausting its
memory: the message's own limit, when it has one (`source=client` messages:
`max_client_message_bytes`), refuses it at the piece that passes it rather than after the whole
stream; and all calls together hold at most `max_assembly_bytes`, so a piece that would pass it
is refused with RESOURCE_EXHAUSTED: reason SERVER_BUSY while other calls hold the rest of the
budget (refused before it is written; clients retry), LIMIT_EXCEEDED when the call's own messages
pass it. Whole messages of unary writes are charged to the same budget while they are written:
writing takes several times their size in memory, and without the charge a few large batches at
once could take the server's. So are an import's messages, whole or in pieces, until their write
is done (`UntilWritten`): an import goes on receiving while its writes are under way, and its
messages given back as they were handed to the writer left several large ones outside the budget.

With tokens, each charge names its holder (the call's token id), and the budget is shared
fairly among them (fair_share.py): one tenant holding two large uploads open (a piece every
50 s) refused every other tenant's writes over 1 MiB for a quarter of an hour.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from types import TracebackType

from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.errors import LimitExceeded
from sessions_server.domain.limits import busy, exceeded
from sessions_server.transport.fair_share import Refusal, Shares

# A unary write of at most this much (the common message: a turn of a conversation) is charged to
# a pool of its own while the pool has room, not to the budget that pieces fill: a security audit
# held the whole budget with one upload (kept open by a piece a minute), and every other tenant's
# 60-byte append was refused SERVER_BUSY for as long as it liked.
SMALL_WRITE_BYTES = 1024 * 1024
SMALL_WRITES_POOL_MAX_BYTES = 64 * 1024 * 1024  # and at most an eighth of the budget


class AssemblyBudget:
    """Bytes of incomplete messages the server holds, across calls; small unary writes apart
    (`holding`). `holder`: the call's token id (None without tokens), whose fair share of the
    budget its charges take."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._shares = Shares(limit_bytes)
        self.small_pool_bytes = min(SMALL_WRITES_POOL_MAX_BYTES, limit_bytes // 8)
        self.small_held_bytes = 0

    @property
    def held_bytes(self) -> int:
        return self._shares.held

    def take(self, size: int, *, already: int = 0, holder: str | None = None) -> None:
        """Charges `size` more bytes to a call that holds `already`, or refuses them: for good
        (LIMIT_EXCEEDED) when that call's messages alone would pass the budget, or what one
        token may hold of it, and for now (SERVER_BUSY: retry shortly) when other calls hold
        the rest of it, or the token's other calls its share."""
        refusal = self._shares.refusal(holder, size)
        if refusal is None:
            self._shares.take(holder, size)
            return
        if already + size > self.limit_bytes:
            raise exceeded(
                f"the messages of this call (at least {already + size} bytes: what had arrived when they passed the "
                "limit) are more than the server holds at once; send smaller messages",
                "max_assembly_bytes",
                self.limit_bytes,
                "bytes",
            )
        if refusal is Refusal.OVER_SHARE and already + size > self.limit_bytes - self._shares.newcomers_room:
            # Past what a lone token may hold (fair_share.py) a call's own charge is over its
            # token's share however empty the server is: waiting would not help.
            raise exceeded(
                f"the messages of this call (at least {already + size} bytes, what had arrived) are more than one "
                "caller may hold at once, "
                "seven eighths of the server's budget for them; send smaller messages",
                "max_assembly_bytes",
                self.limit_bytes,
                "bytes",
            )
        if holder is None:
            what = f"the server holds {self.held_bytes} bytes of messages being received or written and cannot take"
        elif refusal is Refusal.OVER_SHARE:
            # Said without the server's figures: they are other tenants' business.
            what = (
                f"this token's calls hold {self._shares.of(holder)} bytes of messages being received or written, "
                "its share while other callers hold the rest, and may not take"
            )
        else:
            what = "other callers hold the server's room for messages being received or written, which cannot take"
        raise busy(
            f"{what} {size} more now (max_assembly_bytes: {self.limit_bytes} bytes); refused before being written: "
            "retry shortly",
            "max_assembly_bytes",
            self.limit_bytes,
        )

    def give_back(self, size: int, holder: str | None = None) -> None:
        self._shares.give_back(holder, size)

    def charge(self, texts: Iterable[str], holder: str | None = None) -> Release:
        """Charges whole messages (their UTF-8 bytes) until the release returned is called."""
        size = sum(utf8_length(text) for text in texts)
        self.take(size, holder=holder)
        return Release(self, size, holder)

    def until_written(self, wait_for_writes: Callable[[], Awaitable[None]], holder: str | None = None) -> UntilWritten:
        """Charges for a call whose messages stay charged until written (see UntilWritten)."""
        return UntilWritten(self, wait_for_writes, holder)

    @contextlib.contextmanager
    def holding(self, texts: Iterable[str], holder: str | None = None) -> Iterator[None]:
        """Charges whole messages (their UTF-8 bytes) for the block: a write of at most
        SMALL_WRITE_BYTES to the small writes' pool while it has room, else to the budget."""
        size = sum(utf8_length(text) for text in texts)
        small = size <= SMALL_WRITE_BYTES and self.small_held_bytes + size <= self.small_pool_bytes
        if small:
            self.small_held_bytes += size
        else:
            self.take(size, holder=holder)
        try:
            yield
        finally:
            if small:
                self.small_held_bytes -= size
            else:
                self.give_back(size, holder)


# A message in pieces holds its share of the budget while it arrives; one that barely moves would
# hold it for as long as its sender likes (the next frame's 60 s bound is kept by an empty piece a
# minute). After its first minute, a message must have come at this rate on average, or it is
# refused and its pieces dropped: 512 MiB then takes at most about 2.3 hours.
MIN_PIECE_BYTES_PER_SECOND = 64 * 1024
PIECE_RATE_GRACE_SECONDS = 60.0


class Pieces:
    """One message arriving in pieces, charged to the budget until `release` (use `with`: the
    charge lasts while the message is written, and ends however the call does)."""

    def __init__(
        self,
        budget: AssemblyBudget,
        *,
        max_bytes: int = 0,
        what: str = "",
        limit_name: str = "",
        clock: Callable[[], float] = time.monotonic,
        holder: str | None = None,
    ) -> None:
        self._budget = budget
        self._holder = holder
        self._max_bytes = max_bytes  # 0: no limit of its own
        self._what = what
        self._limit_name = limit_name
        self._clock = clock
        self._pieces: list[str] = []
        self._charged = 0
        self._started: float | None = None  # the current message's first piece

    def __enter__(self) -> Pieces:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def add(self, piece: str) -> None:
        size = utf8_length(piece)
        if self._max_bytes and self._charged + size > self._max_bytes:
            raise exceeded(f"{self._what} is larger than allowed", self._limit_name, self._max_bytes, "bytes")
        now = self._clock()
        self._check_rate(size, now)
        self._budget.take(size, already=self._charged, holder=self._holder)
        if self._started is None:  # the message's first piece taken
            self._started = now
        self._charged += size
        self._pieces.append(piece)

    @contextlib.asynccontextmanager
    async def excused(self) -> AsyncIterator[None]:
        """Leaves the time the block takes (the server's own wait) out of the message's rate."""
        began = self._clock()
        try:
            yield
        finally:
            if self._started is not None:
                self._started += self._clock() - began

    def _check_rate(self, size: int, now: float) -> None:
        if self._started is None:
            return
        elapsed = now - self._started
        if elapsed > PIECE_RATE_GRACE_SECONDS and self._charged + size < MIN_PIECE_BYTES_PER_SECOND * elapsed:
            raise exceeded(
                f"the message's pieces came at {int((self._charged + size) / elapsed)} bytes/s on average, "
                "slower than the server holds a message for; the pieces received were dropped",
                "min_piece_bytes_per_second",
                MIN_PIECE_BYTES_PER_SECOND,
                "bytes/s",
            )

    def text(self) -> str:
        """The message so far, joined; the pieces are dropped (the charge stays until release)."""
        text = "".join(self._pieces)
        self._pieces.clear()
        return text

    def release(self) -> None:
        self._pieces.clear()
        self._budget.give_back(self._charged, self._holder)
        self._charged = 0
        self._started = None

    def hand_over(self) -> Release:
        """The message's charge, given back by the release returned instead of by this object
        (which is then empty, ready for the next message)."""
        self._pieces.clear()
        self._started = None
        charged, self._charged = self._charged, 0
        return Release(self._budget, charged, self._holder)


class Release:
    """Gives a charge back to the budget, once however often it is called."""

    __slots__ = ("_budget", "_holder", "_size")

    def __init__(self, budget: AssemblyBudget, size: int, holder: str | None = None) -> None:
        self._budget = budget
        self._size = size
        self._holder = holder

    def __call__(self) -> None:
        size, self._size = self._size, 0
        if size:
            self._budget.give_back(size, self._holder)


class UntilWritten:
    """Charges for a call whose messages stay charged until their write is done (ImportMessages),
    while it receives more. A charge refused for now (SERVER_BUSY) may be refused for what the
    call itself holds: it waits for the call's writes under way (which give their charges back)
    and is tried once more, refused then only for what other calls hold."""

    def __init__(
        self, budget: AssemblyBudget, wait_for_writes: Callable[[], Awaitable[None]], holder: str | None = None
    ) -> None:
        self._budget = budget
        self._wait_for_writes = wait_for_writes
        self._holder = holder

    async def whole(self, texts: Sequence[str]) -> Release:
        """Charges whole messages, until the release returned is called."""
        try:
            return self._budget.charge(texts, self._holder)
        except LimitExceeded as refused:
            if refused.reason != "SERVER_BUSY":
                raise
        await self._wait_for_writes()
        return self._budget.charge(texts, self._holder)

    async def piece(self, pieces: Pieces, piece: str) -> None:
        """Adds a piece to the message arriving in pieces (charged until `hand_over` and its release)."""
        try:
            pieces.add(piece)
            return
        except LimitExceeded as refused:
            if refused.reason != "SERVER_BUSY":
                raise
        async with pieces.excused():  # the import's own writes, not its sender
            await self._wait_for_writes()
        pieces.add(piece)
