"""Compaction as a service: overlays, planning, the server-side summarizer, and automatic
compaction driven by a per-session policy persisted in `cf_agents_session_config`.

Automatic compaction runs after an inserted append whose session token estimate is strictly over
the policy's threshold. It runs in the background, one at a time per session, so an append is
never held up by (or failed by) a model call; a failure is logged and published on the change
feed as a compaction error event. The estimate is kept incrementally as upstream keeps it: a tail
append adds its stamped estimate in O(1), an update of a counted row its difference; other writes
drop it and the next check re-derives it with one content-free path walk.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sessions_server.domain import compaction, jsjson, paths
from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.errors import FailedPrecondition, InvalidArgument, LimitExceeded, Unavailable
from sessions_server.domain.held_plans import HeldPlans
from sessions_server.domain.history import SUMMARY_READ
from sessions_server.domain.limits import RESPONSE_PAYLOAD_BYTES, check_size
from sessions_server.domain.overlays import plan_overlays
from sessions_server.domain.throttle import Throttle
from sessions_server.domain.tokens import estimate_string_tokens
from sessions_server.storage import queries
from sessions_server.storage.feed import ChangeEvent
from sessions_server.storage.queries import CompactionSpan, Connection
from sessions_server.storage.rows import MAX_PATH_DEPTH, Compaction, RowInfo
from sessions_server.storage.store import ObjectStore, WriteContext, now_ms
from sessions_server.storage.watches import Changed, ChangeWatch

if TYPE_CHECKING:
    from sessions_server.domain.service import SessionsService

log = logging.getLogger("sessions.compaction")

POLICY_THRESHOLD_KEY = "compaction.threshold_tokens"
POLICY_KEEP_RECENT_KEY = "compaction.keep_recent_tokens"

MAX_SUMMARIZER_PROMPT_BYTES = RESPONSE_PAYLOAD_BYTES
"""The longest prompt (UTF-8 bytes) the server's summarizer is sent, by `Compact` and automatic
compaction alike: the bound of PlanCompaction's prompt (one response), so that a span either
way of summarizing takes is refused by both or by neither. Planning refuses a longer one as
soon as its text is past it; unbounded, 70 messages of 5 MB made a 325 MB prompt and took
the server's memory up by 1.9 GB."""


class Summarizer(Protocol):
    """Turns a compaction prompt into summary text (e.g. a chat-completions model)."""

    async def summarize(self, prompt: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Policy:
    threshold_tokens: int = 0
    keep_recent_tokens: int = 0

    @property
    def keep_recent(self) -> int:
        return self.keep_recent_tokens or compaction.DEFAULT_KEEP_RECENT_TOKENS


@dataclass(slots=True)
class TokenMemo:
    """The active path's estimate: the leaf it was computed for, the total, the rows walked,
    whether the session had compaction records, and the applied overlays as index ranges of the
    path's rows (the rows they leave uncounted). Kept in step with the remembered path (`paths`),
    which appends extend and updates restate alike: an update finds its row's index there, and
    an append at the walk's cap the row it pushed out."""

    leaf_id: str | None
    total: float
    depth: int
    records: bool
    spans: list[tuple[int, int]]
    # Ids whose append changes more than the tail: a record's end (its overlay may then apply)
    # and the parent the walk stopped at for want of its row (the new row joins more rows).
    rejoining: frozenset[str] = frozenset()


@dataclass(slots=True)
class _Derivation:
    """A derivation of a session's estimate under way; `overtaken` once an append commits."""

    overtaken: bool = False


def _derivations(store: ObjectStore) -> dict[str, list[_Derivation]]:
    """The object's derivations under way, by session (kept on the event loop's thread)."""
    under_way = store.memo.get(_DERIVATIONS_KEY)
    if not isinstance(under_way, dict):
        under_way = store.memo[_DERIVATIONS_KEY] = {}
    return under_way


def _memo_key(kind: str, session_id: str) -> str:
    return f"{kind}\x00{session_id}"


# Per-session facts an open object remembers here (policies, token estimates), the most recently
# used kept: an object open for long with ever new sessions must not keep an entry for each.
MAX_REMEMBERED_SESSION_FACTS = 8192
# How often a session over a threshold no summarizer serves is told so (log and feed).
UNSUMMARIZED_TELL_SECONDS = 60.0
_FACTS_KEY = "compactor"
_DERIVATIONS_KEY = "compactor.derivations"


def read_policy(conn: Connection, session_id: str) -> Policy:
    """The session's stored policy (0 for what is not stored, or not a number)."""

    def number(key: str) -> int:
        value = queries.get_config(conn, session_id, key)
        try:
            return max(0, int(value)) if value is not None else 0
        except ValueError:
            return 0

    return Policy(number(POLICY_THRESHOLD_KEY), number(POLICY_KEEP_RECENT_KEY))


def _facts(store: ObjectStore) -> OrderedDict[str, object]:
    facts = store.memo.get(_FACTS_KEY)
    if not isinstance(facts, OrderedDict):
        facts = store.memo[_FACTS_KEY] = OrderedDict()
    return facts


def _recall(store: ObjectStore, kind: str, session_id: str) -> object:
    facts = _facts(store)
    key = _memo_key(kind, session_id)
    value = facts.get(key)
    if value is not None:
        facts.move_to_end(key)
    return value


def _remember(store: ObjectStore, kind: str, session_id: str, value: object) -> None:
    facts = _facts(store)
    key = _memo_key(kind, session_id)
    facts[key] = value
    facts.move_to_end(key)
    while len(facts) > MAX_REMEMBERED_SESSION_FACTS:
        facts.popitem(last=False)


def forget_estimate(store: ObjectStore, session_id: str) -> None:
    """The session changed other than by appends: what is remembered about it may be wrong."""
    _forget_tokens(store, session_id)
    paths.forget(store, session_id)


def _forget_tokens(store: ObjectStore, session_id: str) -> None:
    _facts(store).pop(_memo_key("tokens", session_id), None)


def note_update(store: ObjectStore, session_id: str, updated: paths.AppendedRow) -> None:
    """An update rewrote one message: the estimate takes the difference when the row is counted
    (on the active path, outside applied overlays), as upstream's does, instead of a walk of
    the whole path on the next check. The remembered path, restated, tells where the row was."""
    place = paths.note_update(store, session_id, updated)
    memo = _recall(store, "tokens", session_id)
    if not isinstance(memo, TokenMemo):
        return
    if place is None or place.leaf_id != memo.leaf_id:
        _forget_tokens(store, session_id)  # where the row stands is not known
        return
    index = place.index
    if index is None or any(start <= index <= end for start, end in memo.spans):
        return  # not counted
    memo.total += updated.info.token_estimate - place.old_tokens


def note_session_changed(ctx: WriteContext, session_id: str, changed: Changed) -> None:
    """Called inside a write job that changes a session other than by adding rows (an update, a
    delete, a clear, a compaction record; not an import, which adds rows as appends do), with
    the ids of the messages it updated or deleted (None: it may have changed anything): a
    compaction planned before it that summarizes one of them, or extends a record that ends on
    one, is refused its record (`storage.watches`); one that summarizes none of them is stored."""
    ctx.note_changed(session_id, changed)


def _prompt_too_large(size: str, limit: int, *, for_summarizer: bool = False) -> LimitExceeded:
    if for_summarizer:  # Compact, and automatic compaction
        return LimitExceeded(
            f"the summarizer prompt for this span is {size}, more than the server sends its summarizer "
            f"(max_summarizer_prompt_bytes, {limit}, as PlanCompaction's prompt); nothing was summarized. "
            "Compact an older part first (a larger keep_recent_tokens ends the span sooner), or summarize "
            "the span in parts and record each with AddCompaction",
            limit="max_summarizer_prompt_bytes",
            limit_value=str(limit),
        )
    # A response over the server's send limit would fail with a bare transport error.
    return LimitExceeded(
        f"the summarizer prompt for this span is {size}, more than a response carries "
        f"(max_response_bytes, {limit}); summarize the span in parts and record each with "
        "AddCompaction, or let a compaction policy compact before the span grows",
        limit="max_response_bytes",
        limit_value=str(limit),
    )


_POLICY_ZERO = {"threshold_tokens": "no automatic compaction", "keep_recent_tokens": "20,000"}
"""What a policy value of 0 means, for a refusal of a negative one."""


class SessionChanged(Exception):
    """A change since a compaction's plan touched what it summarized: plan again."""


# How many times `compact` plans and summarizes again when what it summarized changed meanwhile.
COMPACT_ATTEMPTS = 3
# How many times `plan` reads the history again when it changed between its two reads.
PLAN_ATTEMPTS = 3


class Compactor:
    """Compaction operations on the objects of one service."""

    def __init__(self, service: SessionsService, summarizer: Summarizer | None) -> None:
        self._service = service
        self._summarizer = summarizer
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Sessions told their threshold compacts nothing here (no summarizer).
        self._told_unsummarized = Throttle(UNSUMMARIZED_TELL_SECONDS, MAX_REMEMBERED_SESSION_FACTS)
        self.held_plans = HeldPlans(service.registry)
        self.on_stored: Callable[[str], None] = lambda kind: None  # observability hook

    # ── records ─────────────────────────────────────────────────────────────

    async def add(
        self,
        object_key: str,
        session_id: str,
        summary: str,
        from_id: str,
        to_id: str,
        *,
        event: str = "compaction",
        plan_token: str = "",
    ) -> Compaction:
        """Stores an overlay record (no validation of the ids, as upstream). `plan_token`, from
        `plan_held`: the record is refused (FailedPrecondition SESSION_CHANGED) if a change since
        that plan touched what it depends on; a token is used once."""
        self._check_record(object_key, session_id, summary, from_id, to_id)
        if not plan_token:
            return await self._store(object_key, session_id, summary, from_id, to_id, event)
        held = self.held_plans.take(plan_token, object_key, session_id, from_id, to_id)
        try:
            record = await self._store(
                object_key, session_id, summary, from_id, to_id, event, (held.watch, held.depends_on)
            )
        except SessionChanged:
            self.held_plans.release(held)
            raise FailedPrecondition(
                "a message this summary was made of changed since its plan (an update or delete of one in the "
                "span, beside it or at an end of a record it extends; a clear, another compaction record, the "
                "object replaced or erased): nothing was stored, as the summary might miss the change; plan "
                "again (PlanCompaction) and summarize the new prompt",
                reason="SESSION_CHANGED",
            ) from None
        except asyncio.CancelledError:
            # The caller went away: its write, once queued, may still commit. The token is used,
            # so that a repeat learns so (PLAN_EXPIRED) rather than that nothing was stored.
            self.held_plans.release(held)
            raise
        except BaseException:
            # Failed before it was refused, nothing stored: held again for another try, unless a
            # change already spoiled it.
            if held.watch.touches(held.depends_on):
                self.held_plans.release(held)
            else:
                self.held_plans.put_back(plan_token, held)
            raise
        self.held_plans.release(held)
        return record

    def _check_record(self, object_key: str, session_id: str, summary: str, from_id: str, to_id: str) -> None:
        self._service.check_names(object_key, session_id)
        limit = self._service.limits.max_summary_bytes
        check_size(summary, limit, "the summary", "max_summary_bytes", "summary")
        for field, value in (("from_message_id", from_id), ("to_message_id", to_id)):
            check_size(value, self._service.limits.max_message_id_bytes, field, "max_message_id_bytes", field)

    async def _store(
        self,
        object_key: str,
        session_id: str,
        summary: str,
        from_id: str,
        to_id: str,
        event: str,
        planned: tuple[ChangeWatch, frozenset[str]] | None = None,
    ) -> Compaction:
        """Stores the record. `planned`: the watch begun before the span was planned, and the
        ids the plan depends on; the record is refused (SessionChanged) if a change since
        touched one of them."""
        opened = (
            self._service.object(object_key, writing=True)
            if planned is None
            else self._service.existing_object(object_key, writing=True)  # never a new file
        )
        async with opened as store:
            if store is None:  # erased since the plan
                raise SessionChanged

            def run(ctx: WriteContext) -> Compaction:
                if planned is not None and ctx.touched(*planned):
                    raise SessionChanged
                record = _insert_record(ctx, session_id, summary, from_id, to_id, event)
                # Another record meanwhile: a compaction planned before it would stack on it.
                note_session_changed(ctx, session_id, None)
                return record

            record = await store.write(run, after=lambda _: forget_estimate(store, session_id))
            self.on_stored(event)
            return record

    async def records_after(
        self, object_key: str, session_id: str, after_seq: int, limit: int, max_bytes: int
    ) -> tuple[list[Compaction], bool]:
        """One page of records (`queries.compactions_after`): a listing reads each record once."""
        self._service.check_names(object_key, session_id)
        async with self._service.existing_object(object_key) as store:
            if store is None:
                return [], False
            return await store.read(
                lambda conn: queries.compactions_after(conn, session_id, after_seq, limit, max_bytes), quick=True
            )

    async def spans(self, object_key: str, session_id: str) -> list[CompactionSpan]:
        """The session's records without their summaries, lowest seq first."""
        self._service.check_names(object_key, session_id)
        async with self._service.existing_object(object_key) as store:
            if store is None:
                return []
            return await store.read(lambda conn: queries.compaction_spans(conn, session_id), quick=True)

    async def _summary(self, object_key: str, session_id: str, record_id: str) -> str | None:
        """One record's summary, read by id; None when it is gone."""
        async with self._service.existing_object(object_key) as store:
            if store is None:
                return None
            read = functools.partial(queries.compaction_summary, session_id=session_id, compaction_id=record_id)
            return await store.read(read, quick=True, kind=SUMMARY_READ)

    # ── planning and summarizing ────────────────────────────────────────────

    async def plan(
        self,
        object_key: str,
        session_id: str,
        *,
        leaf_id: str = "",
        keep_recent_tokens: int = 0,
        max_prompt_bytes: int = 0,
    ) -> compaction.CompactionPlan | None:
        """Plans over the history with overlays applied (a bounded path: at most 10,001 rows).
        The history is read twice: once for what planning needs of each message, once for the
        span's messages, rendered into the prompt as they come. `max_prompt_bytes` (0: none)
        refuses a longer prompt as soon as its text is past it (LimitExceeded).
        `keep_recent_tokens` 0: the session's policy, as `compact` takes it."""
        with self._service.registry.watch(object_key, session_id) as watch:
            return await self._plan(object_key, session_id, leaf_id, keep_recent_tokens, max_prompt_bytes, False, watch)

    async def plan_held(
        self,
        object_key: str,
        session_id: str,
        *,
        leaf_id: str = "",
        keep_recent_tokens: int = 0,
        max_prompt_bytes: int = 0,
        holder: str | None = "",
    ) -> tuple[compaction.CompactionPlan, str] | None:
        """`plan`, held for the summary a client makes of it: also returns the token `add`
        takes to refuse that summary if what it depends on changed meanwhile (`held_plans`),
        counted against `holder`'s plans. With `holder` None (a caller that could not store a
        summary) the plan is not held, and its token is empty."""
        if holder is None:
            plan = await self.plan(
                object_key,
                session_id,
                leaf_id=leaf_id,
                keep_recent_tokens=keep_recent_tokens,
                max_prompt_bytes=max_prompt_bytes,
            )
            return None if plan is None else (plan, "")
        registry = self._service.registry
        watch = registry.start_watch(object_key, session_id)
        try:
            planned = await self._plan(
                object_key, session_id, leaf_id, keep_recent_tokens, max_prompt_bytes, False, watch
            )
        except BaseException:
            registry.stop_watch(object_key, watch)
            raise
        if planned is None:
            registry.stop_watch(object_key, watch)
            return None
        return planned, self.held_plans.hold(object_key, session_id, planned, watch, holder=holder)

    async def _plan(
        self,
        object_key: str,
        session_id: str,
        leaf_id: str,
        keep_recent_tokens: int,
        max_prompt_bytes: int,
        for_summarizer: bool,
        watch: ChangeWatch,
    ) -> compaction.CompactionPlan | None:
        """`plan`; `for_summarizer`: the bound is the server's summarizer's (its refusal says so).
        `watch` is begun again before each try's first read: on return it has watched the
        session since the returned plan's.

        Planning holds no summary but those its prompt extends: the first read keeps each
        overlay's record id (`MessageFacts.record_id`) and the records are planned without
        their summaries; the prompt's previous summaries are read by id, counted against the
        bound as they come."""
        _check_keep_recent(keep_recent_tokens)
        keep = keep_recent_tokens or (await self.get_policy(object_key, session_id)).keep_recent
        for _ in range(PLAN_ATTEMPTS):
            watch.restart()  # before the first read
            facts = [
                compaction.message_facts(jsjson.parse(view.json), of_record=view.overlay)
                async for window in self._service.history(object_key, session_id, leaf_id=leaf_id)
                for view in window
            ]
            span = compaction.plan_span(facts, await self.spans(object_key, session_id), keep_recent_tokens=keep)
            if span is None:
                return None
            watch.narrow(span.depends_on)
            bound = _PromptBound(max_prompt_bytes, for_summarizer)
            previous = await self._previous_summaries(object_key, session_id, span, bound)
            rendered = None
            if previous is not None:
                rendered = await self._render_span(object_key, session_id, leaf_id, facts, span, bound)
            # A change other than an append between the reads (an update of a message in the
            # span) would join the first read's span and budget to the second's text.
            if previous is not None and rendered is not None and not watch.touches(span.depends_on):
                prompt = compaction.build_prompt(rendered, compaction.previous_summary(previous), span.budget_tokens)
                del previous, rendered  # in the prompt now
                size = utf8_length(prompt) if max_prompt_bytes else 0
                if size > max_prompt_bytes:
                    raise _prompt_too_large(f"{size} bytes", max_prompt_bytes, for_summarizer=for_summarizer)
                return compaction.CompactionPlan(
                    span.from_message_id, span.to_message_id, prompt, span.budget_tokens, span.depends_on
                )
        raise FailedPrecondition(
            f"the session changed while its compaction was planned ({PLAN_ATTEMPTS} times in a row: the span's "
            "messages updated or deleted, the history before it or its branch changed between planning's reads, "
            "a clear, another record, the object replaced); plan again",
            reason="SESSION_CHANGED",
        )

    async def _previous_summaries(
        self, object_key: str, session_id: str, span: compaction.SpanPlan, bound: _PromptBound
    ) -> list[str] | None:
        """The texts of the summaries a plan's prompt extends, a record's read by id, counted
        against the prompt's bound as they come; None when a record is gone (plan again)."""
        texts: list[str] = []
        for overlay in span.previous:
            text = overlay.summary
            if overlay.record_id is not None:
                text = await self._summary(object_key, session_id, overlay.record_id)
            if text is None:
                return None
            bound.add(utf8_length(text) + (2 if texts else 0))  # joined by a blank line
            texts.append(text)
        return texts

    async def _render_span(
        self,
        object_key: str,
        session_id: str,
        leaf_id: str,
        facts: list[compaction.MessageFacts],
        span: compaction.SpanPlan,
        bound: _PromptBound,
    ) -> list[str] | None:
        """The span's messages rendered for the prompt, read again, counted against the bound;
        None when the history no longer holds the planned messages where they were."""
        rendered: list[str] = []
        index = 0
        windows = self._service.history(object_key, session_id, leaf_id=leaf_id)
        async with contextlib.aclosing(windows):
            async for window in windows:
                for view in window:
                    if index >= span.end:
                        return rendered
                    if index >= span.begin:
                        message = jsjson.parse(view.json)
                        if str(message.get("id")) != facts[index].id:
                            return None
                        if not facts[index].overlay:
                            rendered.append(compaction.render_message(message))
                            bound.add(utf8_length(rendered[-1]))
                    index += 1
        return rendered if index >= span.end else None

    async def compact(
        self, object_key: str, session_id: str, *, leaf_id: str = "", keep_recent_tokens: int = 0
    ) -> Compaction | None:
        """Plans, asks the configured summarizer, stores the overlay (`compact` event).
        `keep_recent_tokens` 0: the session's policy. A prompt past MAX_SUMMARIZER_PROMPT_BYTES
        is refused (LimitExceeded) before the summarizer is asked, as PlanCompaction's is."""
        self._service.check_names(object_key, session_id)  # bad input before the server's state
        _check_keep_recent(keep_recent_tokens)
        if self._summarizer is None:
            self._service.objects.admit(object_key, writing=True)  # the owner, elsewhere, may summarize
            raise FailedPrecondition(
                "no summarizer is configured on this server (--summarizer-url); "
                "plan with PlanCompaction and store the summary with AddCompaction instead",
                reason="NO_SUMMARIZER",
            )
        if not keep_recent_tokens:
            keep_recent_tokens = (await self.get_policy(object_key, session_id)).keep_recent
        for _ in range(COMPACT_ATTEMPTS):
            # Begun before the history is read, the watch lasts through the model's call, while
            # the object may close and open again.
            with self._service.registry.watch(object_key, session_id) as watch:
                planned = await self._plan(
                    object_key, session_id, leaf_id, keep_recent_tokens, MAX_SUMMARIZER_PROMPT_BYTES, True, watch
                )
                if planned is None:
                    return None
                summary = await self._summarize(planned.prompt)
                if summary is None:
                    return None
                span = (planned.from_message_id, planned.to_message_id)
                self._check_record(object_key, session_id, summary, *span)
                try:
                    return await self._store(
                        object_key, session_id, summary, *span, "compact", (watch, planned.depends_on)
                    )
                except SessionChanged:
                    continue  # what it summarized changed while the summary was made: it may be stale
        # Not "nothing to compact": a caller (and automatic compaction, which reports it as a
        # compaction_error) must learn that the model was asked and nothing was stored.
        raise FailedPrecondition(
            f"the messages each of {COMPACT_ATTEMPTS} summaries was made of changed while it was made (an update "
            "or delete of one of them, a clear, another compaction record, the object replaced): none was "
            "stored, as it might miss the change; compact again",
            reason="SESSION_CHANGED",
        )

    async def _summarize(self, prompt: str) -> str | None:
        """The configured summarizer's answer; None when it is blank (nothing to store)."""
        assert self._summarizer is not None
        try:
            summary = await self._summarizer.summarize(prompt)
        except Exception as exc:
            raise Unavailable(f"the summarizer failed: {exc}", reason="SUMMARIZER_FAILED") from exc
        if not jsjson.js_trim(summary):  # upstream's test: Python's strip() knows other blanks
            return None
        size = utf8_length(summary)
        limit = self._service.limits.max_summary_bytes
        if limit and size > limit:
            # The model's answer, not the caller's input: nothing the caller sent is wrong.
            raise Unavailable(
                f"the summarizer answered {size} bytes, more than a summary may hold "
                f"(max_summary_bytes {limit}); nothing was stored",
                reason="SUMMARIZER_FAILED",
            )
        return summary

    # ── policy ──────────────────────────────────────────────────────────────

    async def set_policy(self, object_key: str, session_id: str, policy: Policy) -> Policy:
        self._service.check_names(object_key, session_id)
        for name, value in (
            ("threshold_tokens", policy.threshold_tokens),
            ("keep_recent_tokens", policy.keep_recent_tokens),
        ):
            if value < 0:
                raise InvalidArgument(
                    f"policy.{name} must not be negative, not {value} (0: {_POLICY_ZERO[name]})", field=f"policy.{name}"
                )
        if policy.threshold_tokens and self._summarizer is None:
            # A call for an object owned elsewhere is told where first (the owner may summarize).
            self._service.objects.admit(object_key, writing=True)
            # Stored, the threshold would never compact anything, and nothing would say so.
            raise FailedPrecondition(
                "automatic compaction needs a summarizer on this server (--summarizer-url); nothing was "
                "stored. A threshold of 0 still stores keep_recent_tokens, which PlanCompaction uses",
                reason="NO_SUMMARIZER",
            )

        def run(ctx: WriteContext) -> None:
            queries.set_config(ctx.conn, session_id, POLICY_THRESHOLD_KEY, str(policy.threshold_tokens))
            queries.set_config(ctx.conn, session_id, POLICY_KEEP_RECENT_KEY, str(policy.keep_recent_tokens))

        def noted(_: None) -> None:
            _remember(store, "policy", session_id, policy)

        async with self._service.object(object_key, writing=True) as store:
            await store.write(run, after=noted)
        return policy

    async def get_policy(self, object_key: str, session_id: str) -> Policy:
        self._service.check_names(object_key, session_id)
        async with self._service.existing_object(object_key) as store:
            return Policy() if store is None else await self._policy(store, session_id)

    async def _policy(self, store: ObjectStore, session_id: str) -> Policy:
        cached = _recall(store, "policy", session_id)
        if isinstance(cached, Policy):
            return cached
        # Two point reads, once per session while open (an append reads them in its own
        # transaction instead: `policy_unknown`).
        policy = await store.read(functools.partial(read_policy, session_id=session_id), quick=True)
        _remember(store, "policy", session_id, policy)
        return policy

    def policy_unknown(self, store: ObjectStore, session_id: str) -> bool:
        """Whether the session's policy is not remembered. An append then reads it in its own
        write job (`read_policy`) and has it remembered (`note_policy`) as it commits: the check
        after the append would otherwise read it on a reader connection of its own, which a new
        object opens for that alone (about 1.5 ms of a new object's 17 ms of server CPU, 16
        calls in flight)."""
        return not isinstance(_recall(store, "policy", session_id), Policy)

    def note_policy(self, store: ObjectStore, session_id: str, policy: Policy) -> None:
        """Remembers a policy a write job read (`read_policy`); on the event loop's thread, in
        commit order, as `set_policy` remembers the one it writes."""
        _remember(store, "policy", session_id, policy)

    # ── the session estimate and automatic compaction ───────────────────────

    async def token_estimate(self, store: ObjectStore, session_id: str) -> int:
        cached = _recall(store, "tokens", session_id)
        memo = cached if isinstance(cached, TokenMemo) else None
        if memo is None:
            stamp = paths.walk_stamp(store, session_id)  # before the read's snapshot

            def derive(conn: Connection) -> TokenMemo:
                leaf = store.latest_leaf_id(conn, session_id)
                if not leaf:
                    return TokenMemo(None, 0.0, 0, False, [])
                path = paths.path_stats(store, conn, session_id, leaf, stamp)
                rows = [(row.id, row.token_estimate) for row in path.rows]
                records = queries.compaction_spans(conn, session_id)
                # Each applied overlay's summary is read, estimated and let go: one at a time.
                spans = [
                    (span.start, span.end, _summary_tokens(conn, session_id, span.compaction.id))
                    for span in plan_overlays([r[0] for r in rows], records)
                ]
                total = float(compaction.session_token_estimate(rows, spans))
                rejoining = frozenset(
                    [record.to_message_id for record in records] + ([path.open_parent] if path.open_parent else [])
                )
                ranges = [(start, end) for start, end, _ in spans]
                return TokenMemo(leaf, total, path.walked, bool(records), ranges, rejoining)

            # Appends do not move the version: one committed while the read ran (it may have
            # read before it) marks the derivation overtaken.
            derivation = _Derivation()
            under_way = _derivations(store).setdefault(session_id, [])
            under_way.append(derivation)
            try:
                memo = await store.read(derive)
            finally:
                under_way.remove(derivation)
                if not under_way:
                    _derivations(store).pop(session_id, None)
            if not derivation.overtaken and paths.session_version(store, session_id) == stamp.version:
                _remember(store, "tokens", session_id, memo)  # else it may be of an older state
        return max(0, int(-(-memo.total // 1)))

    def note_appends(
        self, store: ObjectStore, session_id: str, infos: list[RowInfo], pushed_out: list[int] | None
    ) -> None:
        """Extends the memoised estimate by tail appends; anything else drops it. `pushed_out`:
        what `paths.note_appends` reports of the rows the appends pushed off the remembered path."""
        for derivation in _derivations(store).get(session_id, ()):
            derivation.overtaken = True
        memo = _recall(store, "tokens", session_id)
        if not isinstance(memo, TokenMemo):
            return
        leaving = iter(pushed_out or ())
        for info in infos:
            if memo.leaf_id != info.parent_id:
                forget_estimate(store, session_id)
                return
            if info.id in memo.rejoining:  # derived again (upstream's adds the row alone)
                _forget_tokens(store, session_id)
                return
            if memo.depth > MAX_PATH_DEPTH:
                # At the walk's cap the oldest row leaves as the new one comes. Without records
                # (no overlay to start or end with it) the estimate loses that row's; otherwise it
                # is derived again, from the remembered path, which stays.
                left = next(leaving, None)
                if left is None or memo.records:
                    _forget_tokens(store, session_id)
                    return
                memo.total -= left
            else:
                memo.depth += 1
            memo.leaf_id = info.id
            memo.total += info.token_estimate

    async def after_inserted_append(self, store: ObjectStore, object_key: str, session_id: str) -> None:
        """Starts an automatic compaction once the session is over its policy's threshold. The
        append has committed: a failure to find out (its reads) is logged, not its answer."""
        try:
            policy = await self._policy(store, session_id)
            if policy.threshold_tokens <= 0:
                return
            if await self.token_estimate(store, session_id) <= policy.threshold_tokens:
                return
        except Exception as exc:
            log.warning("%r/%r: could not check for automatic compaction: %s", object_key, session_id, exc)
            return
        if self._summarizer is None:
            await self._tell_unsummarized(object_key, session_id, policy.threshold_tokens)
            return
        running = self._running.get((object_key, session_id))
        if running is not None and not running.done():
            return
        task = asyncio.get_running_loop().create_task(self._auto_compact(object_key, session_id))
        self._running[(object_key, session_id)] = task
        task.add_done_callback(_forget_task(self._running, (object_key, session_id)))

    async def _tell_unsummarized(self, object_key: str, session_id: str, threshold: int) -> None:
        """A threshold stored where no summarizer is (set on a server with one, then this one
        started without it, or the object brought here) compacts nothing: said in the log and on
        the feed as a compaction error, once a minute a session, rather than not at all."""
        if not self._told_unsummarized.due((object_key, session_id)):
            return
        detail = (
            f"NoSummarizer: the session's threshold of {threshold} tokens compacts nothing here: this server "
            "has no summarizer (--summarizer-url); start it with one, or set the threshold to 0"
        )
        log.warning("automatic compaction of %r/%r: %s", object_key, session_id, detail)
        await self._service.publish(object_key, ChangeEvent("compaction_error", session_id, error=detail))

    async def _auto_compact(self, object_key: str, session_id: str) -> None:
        try:
            await self.compact(object_key, session_id)
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            log.warning("automatic compaction of %r/%r failed: %s", object_key, session_id, detail)
            await self._service.publish(object_key, ChangeEvent("compaction_error", session_id, error=detail))

    async def wait_idle(self, seconds: float) -> None:
        """Waits up to `seconds` for running automatic compactions, then cancels those left
        (used on shutdown: a model call may take far longer than the drain; nothing of a
        cancelled one is stored, and the next append over the threshold starts it again)."""
        tasks = [task for task in self._running.values() if not task.done()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, seconds))
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


@dataclass(slots=True)
class _PromptBound:
    """What a prompt being planned holds so far, against its bound (0: none): refused as soon
    as its text passes it (the prompt's own template comes on top)."""

    max_bytes: int
    for_summarizer: bool
    used: int = 0

    def add(self, size: int) -> None:
        self.used += size
        if self.max_bytes and self.used > self.max_bytes:
            raise _prompt_too_large(f"over {self.max_bytes} bytes", self.max_bytes, for_summarizer=self.for_summarizer)


def _summary_tokens(conn: Connection, session_id: str, record_id: str) -> int:
    """The string estimate of a record's summary (0 when the record is gone: a clear, which
    also drops what this derivation would be remembered as)."""
    summary = queries.compaction_summary(conn, session_id, record_id)
    return 0 if summary is None else estimate_string_tokens(summary)


def _forget_task(
    running: dict[tuple[str, str], asyncio.Task[None]], key: tuple[str, str]
) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        if running.get(key) is task:
            del running[key]

    return done


def _insert_record(
    ctx: WriteContext, session_id: str, summary: str, from_id: str, to_id: str, event: str
) -> Compaction:
    record = Compaction(
        id=str(uuid.uuid4()),
        seq=queries.next_compaction_seq(ctx.conn, session_id),
        summary=summary,
        from_message_id=from_id,
        to_message_id=to_id,
        created_at_ms=now_ms(),
    )
    queries.insert_compaction(ctx.conn, session_id, record)
    ctx.row_writes += 1
    ctx.emit(ChangeEvent(event, session_id, compaction=record if event == "compaction" else None))
    return record


def _check_keep_recent(keep_recent_tokens: int) -> None:
    if keep_recent_tokens < 0:
        raise InvalidArgument("keep_recent_tokens must not be negative", field="keep_recent_tokens")
