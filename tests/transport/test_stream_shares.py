"""The stream slots' rule (transport/calls.py `StreamSlots`, transport/fair_share.py), without a
server: with tokens, once half the slots are taken, a token holding some takes more only while
it holds less than its share of what the others leave (a lone token, all but an eighth), so
that a token holding none finds a slot; a refusal for its share or for others' streams is
SERVER_BUSY (shares change as streams end), one for its cap LIMIT_EXCEEDED.
Without tokens the slots go first come, first served, as they always did."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from sessions_server.domain.errors import LimitExceeded
from sessions_server.transport.calls import StreamSlots


@dataclass
class Caller:
    """A call's context as StreamSlots sees it: its metadata, naming its token."""

    token: str | None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return () if self.token is None else (("authorization", self.token),)


def token_of(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    return next((str(value) for key, value in metadata if key == "authorization"), None)


class Held:
    """Streams taken and kept open, as idle feeds are."""

    def __init__(self, slots: StreamSlots) -> None:
        self._slots = slots
        self._open = contextlib.ExitStack()

    def take(self, token: str | None) -> None:
        self._open.enter_context(self._slots.take(Caller(token)))

    def take_until_refused(self, token: str, most: int) -> tuple[int, LimitExceeded | None]:
        """Takes up to `most` streams for `token`: how many it got, and the refusal that stopped it."""
        for taken in range(most):
            try:
                self.take(token)
            except LimitExceeded as refused:
                return taken, refused
        return most, None

    def close(self) -> None:
        self._open.close()


def _reason(refused: LimitExceeded | None) -> tuple[str, str] | None:
    return None if refused is None else (refused.reason, refused.metadata["limit"])


def test_without_tokens_the_slots_go_first_come_first_served() -> None:
    slots = StreamSlots(4)  # no tokens file: no token to tell callers apart
    held = Held(slots)
    for _ in range(4):
        held.take("A")
    with pytest.raises(LimitExceeded) as refused:
        held.take(None)
    assert _reason(refused.value) == ("LIMIT_EXCEEDED", "max_concurrent_streams")
    assert str(refused.value) == "too many concurrent streams on this server: the limit is 4 (max_concurrent_streams)"
    held.close()
    assert slots.active == 0


def test_two_tenants_at_their_cap_leave_a_third_its_reads() -> None:
    """The audit's case: 20 slots, 10 per token. A and C each asked for their 10 idle feeds and
    got them, and every read of B (holding none) was refused, LIMIT_EXCEEDED, which the
    clients do not retry."""
    slots = StreamSlots(20, per_token=10, token_of=token_of)
    held = Held(slots)
    assert held.take_until_refused("A", 10) == (10, None)  # half the pool: not contended yet
    got, refused = held.take_until_refused("C", 10)
    assert got == 4  # 4 * 2 tokens >= the 6 left free
    assert _reason(refused) == ("SERVER_BUSY", "max_concurrent_streams")
    assert "this token holds 4 streams, its share" in str(refused)
    # B holds none: it reads, a second read at once too (1 * 3 < 5 free), not a third (2 * 3 >= 4).
    assert held.take_until_refused("B", 3)[0] == 2
    assert slots.active == 16  # slots stay free for newcomers
    held.close()
    assert slots.active == 0


def test_a_token_holding_none_is_refused_only_when_every_slot_is_taken_and_busy_then() -> None:
    slots = StreamSlots(4, token_of=token_of)  # no cap per token: the share alone bounds
    held = Held(slots)
    assert held.take_until_refused("A", 4)[0] == 3  # alone: all but the newcomer's one
    assert held.take_until_refused("B", 4)[0] == 1  # the last slot, a newcomer's
    got, refused = held.take_until_refused("C", 1)
    assert got == 0
    assert _reason(refused) == ("SERVER_BUSY", "max_concurrent_streams")
    assert str(refused) == "the server's streams are taken by other callers; retry shortly (max_concurrent_streams: 4)"
    held.close()


def test_a_refusal_names_its_own_figures_only() -> None:
    """Neither refusal tells a tenant how many streams the server or the other tokens hold."""
    slots = StreamSlots(4, token_of=token_of)
    held = Held(slots)
    held.take_until_refused("A", 4)
    _, mine = held.take_until_refused("A", 1)
    assert mine is not None and str(mine) == (
        "this token holds 3 streams, its share while other callers hold the server's streams too; "
        "retry shortly, or end some of its feeds or reads"
    )
    held.close()


def test_the_cap_per_token_still_refuses_first() -> None:
    slots = StreamSlots(4096, per_token=2, token_of=token_of)
    held = Held(slots)
    got, refused = held.take_until_refused("A", 3)
    assert got == 2
    assert _reason(refused) == ("LIMIT_EXCEEDED", "max_streams_per_token")
    held.close()


def test_slots_given_back_are_a_share_again() -> None:
    slots = StreamSlots(4, token_of=token_of)
    with (
        slots.take(Caller("A")),
        slots.take(Caller("A")),
        slots.take(Caller("A")),
        pytest.raises(LimitExceeded),
        slots.take(Caller("A")),
    ):
        pass
    held = Held(slots)
    assert held.take_until_refused("A", 4)[0] == 3  # its three came back
    held.close()


def test_greedy_tokens_fill_the_default_pool_only_when_there_are_many_of_them() -> None:
    """With the defaults (4,096 slots, 1,024 per token), tokens that each take all they may, one
    after the other: a share of the whole pool (pool / (tokens + 1)) let six of them refuse
    every other; the share of what the others leave needs 138."""
    slots = StreamSlots(4096, per_token=1024, token_of=token_of)
    held = Held(slots)
    tokens = 0
    while True:
        got, refused = held.take_until_refused(f"t{tokens}", 1024)
        if got == 0:
            assert _reason(refused) == ("SERVER_BUSY", "max_concurrent_streams")
            break
        tokens += 1
    assert tokens == 138
    assert slots.active == 4096
    held.close()
