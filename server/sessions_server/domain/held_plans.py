"""Compaction plans whose summary a client makes, held until it comes back.

PlanCompaction hands out a token with its plan; AddCompaction given that token stores the
record only if nothing the plan depends on changed since (`storage.watches`), the check `Compact`
makes across its own model call. Without the token, a summary made while the span was edited
would be stored as if it were current.

A held plan keeps a watch on its object that every commit there tells, and its ids in memory, so
plans are bounded: in time, in number for each holder (a caller's token: one caller making plans
lets go of its own oldest, not of others'), and in the bytes of their ids for the whole server
(the holder holding most lets go first). A plan lives in the process that made it: after a
restart its token is unknown and refused (PLAN_EXPIRED: plan again), never taken for a check
that passed; so is it on another server, where the object moved.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sessions_server.domain.compaction import CompactionPlan
from sessions_server.domain.errors import FailedPrecondition, InvalidArgument
from sessions_server.storage.watches import ChangeWatch

if TYPE_CHECKING:
    from sessions_server.storage.registry import ObjectRegistry

PLAN_HOLD_SECONDS = 15 * 60
"""How long a plan is held: a model call on the client, retries included, fits well inside."""
MAX_PLANS_PER_HOLDER = 1_024
MAX_HELD_BYTES = 64 * 1024 * 1024
"""Of the ids the held plans depend on, all together, as `_weight` counts them (a plan's ids are
at most a path's, 10,001, and an id up to 16 KiB)."""
_ID_OVERHEAD_BYTES = 100  # a Python string and its slots in the plan's set and the watch's
TOKEN_PREFIX = "cpt1_"
_TOKEN_BYTES = 16
_TOKEN_FORM = re.compile(re.escape(TOKEN_PREFIX) + f"[A-Za-z0-9_-]{{{len(secrets.token_urlsafe(_TOKEN_BYTES))}}}")


@dataclass(frozen=True)
class HeldPlan:
    object_key: str
    session_id: str
    from_message_id: str
    to_message_id: str
    depends_on: frozenset[str]
    watch: ChangeWatch
    expires_at: float
    holder: str
    weight: int


def _weight(ids: frozenset[str]) -> int:
    return sum(len(i.encode("utf-8", "surrogatepass")) + _ID_OVERHEAD_BYTES for i in ids)


class HeldPlans:
    """The plans of one server awaiting their summaries, by token. Used on the event loop."""

    def __init__(
        self,
        registry: ObjectRegistry,
        *,
        hold_seconds: float = PLAN_HOLD_SECONDS,
        max_plans_per_holder: int = MAX_PLANS_PER_HOLDER,
        max_bytes: int = MAX_HELD_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._hold_seconds = hold_seconds
        self._max_plans = max_plans_per_holder
        self._max_bytes = max_bytes
        self._clock = clock
        self._plans: OrderedDict[str, HeldPlan] = OrderedDict()  # least recently held first
        self._bytes = 0
        self._by_holder: dict[str, dict[str, None]] = {}  # each holder's tokens, oldest first
        self._holder_bytes: dict[str, int] = {}
        self._sweep: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._plans)

    def hold(
        self, object_key: str, session_id: str, plan: CompactionPlan, watch: ChangeWatch, *, holder: str = ""
    ) -> str:
        """Holds `plan` for `holder`, watched by `watch` since before it was read (the watch is
        the plans' now: they stop it); returns its token."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(_TOKEN_BYTES)
        expires_at = self._clock() + self._hold_seconds
        span = (plan.from_message_id, plan.to_message_id)
        held = HeldPlan(
            object_key, session_id, *span, plan.depends_on, watch, expires_at, holder, _weight(plan.depends_on)
        )
        self._add(token, held)
        self._let_go_expired()
        while len(self._by_holder[holder]) > self._max_plans:
            self._let_go(next(iter(self._by_holder[holder])))
        while self._bytes > self._max_bytes and len(self._plans) > 1:
            self._let_go(self._heaviest_holders_oldest(sparing=token))
        self._schedule_sweep()
        return token

    def take(self, token: str, object_key: str, session_id: str, from_id: str, to_id: str) -> HeldPlan:
        """The plan of `token` for this span, no longer held: `release` it once its record is
        stored or refused, `put_back` if the attempt was cut before either. Refuses a token of
        another plan (InvalidArgument) and one not held (PLAN_EXPIRED), leaving it as it was."""
        if not _TOKEN_FORM.fullmatch(token):
            raise InvalidArgument(
                "plan_token is not of the form PlanCompaction returns: pass the plan_token of the plan the "
                "summary was made from, as it came",
                field="plan_token",
            )
        self._let_go_expired()
        held = self._plans.get(token)
        if held is None:
            minutes = round(self._hold_seconds / 60)
            raise FailedPrecondition(
                f"this server holds no plan with this plan_token: a plan is held for {minutes} minutes and used "
                f"once, by the server that made it (not one the object moved to), and is let go when that server "
                f"restarts or when its caller holds more than {self._max_plans} plans; plan again "
                "(PlanCompaction) and summarize the new prompt",
                reason="PLAN_EXPIRED",
            )
        if (held.object_key, held.session_id) != (object_key, session_id):
            raise InvalidArgument(
                "plan_token is the token of a plan of another object or session: pass the plan_token "
                "PlanCompaction returned for this session",
                field="plan_token",
            )
        if (held.from_message_id, held.to_message_id) != (from_id, to_id):
            raise InvalidArgument(
                f"from_message_id and to_message_id must be the plan's ({held.from_message_id!r} to "
                f"{held.to_message_id!r}) when plan_token is given: the summary was made of that span",
                field="from_message_id",
            )
        self._remove(token)
        return held

    def release(self, held: HeldPlan) -> None:
        self._registry.stop_watch(held.object_key, held.watch)

    def put_back(self, token: str, held: HeldPlan) -> None:
        """Holds again a plan `take`n for an attempt that stored nothing and was not refused."""
        if held.expires_at <= self._clock():
            self.release(held)
            return
        self._add(token, held)
        self._schedule_sweep()

    def close(self) -> None:
        """Lets every plan go (the server is stopping)."""
        for token in list(self._plans):
            self._let_go(token)
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def _add(self, token: str, held: HeldPlan) -> None:
        self._plans[token] = held
        self._bytes += held.weight
        self._by_holder.setdefault(held.holder, {})[token] = None
        self._holder_bytes[held.holder] = self._holder_bytes.get(held.holder, 0) + held.weight

    def _remove(self, token: str) -> HeldPlan:
        held = self._plans.pop(token)
        self._bytes -= held.weight
        tokens = self._by_holder[held.holder]
        del tokens[token]
        self._holder_bytes[held.holder] -= held.weight
        if not tokens:
            del self._by_holder[held.holder], self._holder_bytes[held.holder]
        return held

    def _heaviest_holders_oldest(self, *, sparing: str) -> str:
        """The oldest plan, but `sparing`, of the holder whose plans weigh most."""
        holders = sorted(self._holder_bytes, key=self._holder_bytes.__getitem__, reverse=True)
        return next(token for holder in holders for token in self._by_holder[holder] if token != sparing)

    def _let_go(self, token: str) -> None:
        self.release(self._remove(token))

    def _let_go_expired(self) -> None:
        now = self._clock()
        for token in [token for token, held in self._plans.items() if held.expires_at <= now]:
            self._let_go(token)

    def _schedule_sweep(self) -> None:
        """Lets expired plans go on time, so their watches do not outlive them on an idle server."""
        if self._sweep is not None or not self._plans:
            return
        soonest = min(held.expires_at for held in self._plans.values())
        self._sweep = asyncio.get_running_loop().call_later(max(0.0, soonest - self._clock()), self._on_sweep)

    def _on_sweep(self) -> None:
        self._sweep = None
        self._let_go_expired()
        self._schedule_sweep()
