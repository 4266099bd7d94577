"""Fair shares of a server-wide limit among bearer tokens (stream slots, bytes of messages held).

A limit taken first come, first served let a few tenants hold all of it (idle feeds, unread
reads, uploads kept open by a piece a minute) and refuse every other tenant. Nothing taken is
ever taken back, so fairness can only be in what is given: while at most half of the limit is
held, anyone takes what fits; past that, a token that already holds some may take more only
while it holds less than an equal part of what the other tokens leave, shared among the tokens
holding some and one newcomer:

    holding < (limit - held by the others) / (tokens holding some + 1)
    i.e. holding * tokens holding some < free

A token holding some while no other does may take all but an eighth of the limit, the room kept
for a newcomer: a lone tenant's stream slots, or its one large message in pieces, are not held to
half the limit for tenants that may never come.

A token holding none is refused only when what it asks for does not fit. A share of the whole
limit (limit / (tokens + 1)) let the tokens that came first keep the larger shares they took
while fewer tokens held any: six tokens, each taking all it could one after another, filled
4,096 stream slots (1,024 per token). This share shrinks as the limit fills, so what is left
stays for newcomers: 138 such tokens are needed to fill it (taking turns, tokens fill little more
than half).
"""

from __future__ import annotations

import enum


class Refusal(enum.Enum):
    BUSY = "others hold what is free"  # what was asked for does not fit
    OVER_SHARE = "the holder holds its share"


class Shares:
    """What each holder (a token's id) holds of one limit, and what it may take more."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # by every holder, the anonymous (None) included
        self._by_holder: dict[str, int] = {}

    @property
    def newcomers_room(self) -> int:
        """What a lone holder leaves free: an eighth of the limit (at least one)."""
        return max(1, self.limit // 8)

    def of(self, holder: str | None) -> int:
        return 0 if holder is None else self._by_holder.get(holder, 0)

    def refusal(self, holder: str | None, amount: int) -> Refusal | None:
        """Why `holder` may not take `amount` more now, or None when it may. An anonymous
        holder (no tokens) has no share: it takes what fits. Asking for nothing (an empty piece
        of a message) is never refused."""
        if amount == 0:
            return None
        holding = self.of(holder)
        if holding and self.held + amount > self.limit // 2:
            free = self.limit - self.held
            holders = len(self._by_holder)
            over = (free - amount < self.newcomers_room) if holders == 1 else (holding * holders >= free)
            if over:
                return Refusal.OVER_SHARE
        if self.held + amount > self.limit:
            return Refusal.BUSY
        return None

    def take(self, holder: str | None, amount: int) -> None:
        """Charges `amount` to `holder`, whatever `refusal` says (the caller asked it first)."""
        self.held += amount
        if holder is not None and amount:
            self._by_holder[holder] = self._by_holder.get(holder, 0) + amount

    def give_back(self, holder: str | None, amount: int) -> None:
        self.held -= amount
        if holder is not None and amount:
            left = self._by_holder[holder] - amount
            if left:
                self._by_holder[holder] = left
            else:
                del self._by_holder[holder]
