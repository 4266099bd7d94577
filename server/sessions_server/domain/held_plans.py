"""Compaction plans whose summary a client makes, held until it comes back.

PlanCompaction hands out a token with its plan; AddCompaction given that token stores the
record only if nothing the plan depends on changed since (`storage.watches`), the check `Compact`
makes across its own model call. Without the token, a summary made while the span was edited
would be stored as if it were current.

A held plan keeps a watch on its object that every commit there tells, so plans are bounded: in
time, in number and in the ids they watch, the oldest let go first. A plan lives in the process
that made it: after a restart or a move its token is unknown and refused (PLAN_EXPIRED: plan
again), never taken for a check that passed.
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
MAX_HELD_PLANS = 1_024
MAX_HELD_IDS = 1_000_000
"""Ids the held plans depend on, all together (a plan's are at most a path's, 10,001)."""
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


class HeldPlans:
    """The plans of one server awaiting their summaries, by token. Used on the event loop."""

    def __init__(
        self,
        registry: ObjectRegistry,
        *,
        hold_seconds: float = PLAN_HOLD_SECONDS,
        max_plans: int = MAX_HELD_PLANS,
        max_ids: int = MAX_HELD_IDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._hold_seconds = hold_seconds
        self._max_plans = max_plans
        self._max_ids = max_ids
        self._clock = clock
        self._plans: OrderedDict[str, HeldPlan] = OrderedDict()  # oldest first
        self._ids = 0
        self._sweep: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._plans)

    def hold(self, object_key: str, session_id: str, plan: CompactionPlan, watch: ChangeWatch) -> str:
        """Holds `plan`, watched by `watch` since before it was read (the watch is the plans'
        now: they stop it); returns its token."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(_TOKEN_BYTES)
        expires_at = self._clock() + self._hold_seconds
        held = HeldPlan(
            object_key, session_id, plan.from_message_id, plan.to_message_id, plan.depends_on, watch, expires_at
        )
        self._add(token, held)
        self._let_go_expired()
        while len(self._plans) > 1 and (len(self._plans) > self._max_plans or self._ids > self._max_ids):
            self._let_go(next(iter(self._plans)))
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
                f"once, and is forgotten when the server restarts, when the object moves, or when more than "
                f"{self._max_plans} plans are held; plan again (PlanCompaction) and summarize the new prompt",
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
        self._ids += len(held.depends_on)

    def _remove(self, token: str) -> HeldPlan:
        held = self._plans.pop(token)
        self._ids -= len(held.depends_on)
        return held

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
