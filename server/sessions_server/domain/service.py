"""Session semantics over the storage layer: the operations the contract exposes.

Every operation checks its names, opens the object (or finds it never written) and runs there.
Writes prepare their messages here (`messages`: parse, shape rules, sanitize, stamps) and hand
storage finished rows; reads along paths are `history`'s, imports `imports`', the search index
`search_index`'s. Results are plain records; the transport maps them to the wire.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import cast

from sessions_server.domain import attachments, jsjson, keys, large_messages, messages, paths, search_index
from sessions_server.domain import history as history_reads
from sessions_server.domain import search as search_rules
from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.compactor import (
    Compactor,
    Policy,
    Summarizer,
    forget_estimate,
    note_session_changed,
    note_update,
    read_policy,
)
from sessions_server.domain.errors import (
    FailedPrecondition,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    SessionsError,
    StorageFailure,
    Unavailable,
)
from sessions_server.domain.history import WINDOW_BYTES, WINDOW_ROWS, RecentSummary
from sessions_server.domain.imports import Importer
from sessions_server.domain.limits import (
    ID_OVERHEAD_BYTES,
    MAX_BATCH_RESULT_BYTES,
    MAX_DELETE_IDS_BYTES,
    RESULT_OVERHEAD_BYTES,
    Limits,
    check_room,
    exceeded,
    results_bytes,
    stored_read_back,
    stored_text_limits,
)
from sessions_server.domain.objects import ObjectAdmin
from sessions_server.domain.placement import Placement
from sessions_server.domain.search import SearchHit
from sessions_server.domain.views import MessageView, as_read_inline, stored_row_ok, view_of
from sessions_server.storage import queries
from sessions_server.storage.feed import ChangeEvent, FeedClosed, Reset
from sessions_server.storage.queries import Connection
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import (
    InlineTooLarge,
    NewRow,
    Parent,
    PathStat,
    QueryInterrupted,
    QueryRejected,
    RowInfo,
    StorageError,
    StoredRowUnreadable,
    UpdateOutcome,
)
from sessions_server.storage.schema import ObjectKeyConflict
from sessions_server.storage.store import (
    ObjectStore,
    WriteContext,
    append_chain_in,
    append_in,
    clear_in,
    delete_in,
    update_in,
)

log = logging.getLogger("sessions.service")
# Reads whose cost grows with the whole object (a search's ranking, its counts, a page of its
# sessions) may run in place for a lone caller when the object holds up to this much (its pages
# as of its last commit). Measured here: a common word (in a fifth of 1 KB messages) ranked in
# 0.5 ms at 2.4 MB, 1.3 ms at 5.7 MB and 5.3 ms at 22 MB, past the 5 ms a read may hold the
# event loop; the counts and a page of 100 sessions took 0.3 ms at 3.9 MB, 0.5-0.6 ms at 12.8 MB.
# A larger object's reads take the executor from the start, instead of spending those 5 ms first.
IN_PLACE_MAX_OBJECT_BYTES = 4 * 1024 * 1024
# An append's input as prepared: its index in the call, the parsed message, and what is stored
# (None for a compaction overlay's id, which is written nowhere).
_Staged = tuple[int, "messages.Message", "messages.PreparedMessage | None"]


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class AppendResult:
    inserted: bool
    message: MessageView


@dataclass(frozen=True, slots=True)
class UpdateResult:
    found: bool
    changed: bool
    message: MessageView | None


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class AppendInput:
    """One message of an AppendMessages batch, as the transport decoded it."""

    text: str
    parent: Parent
    from_client: bool


ONE_MESSAGE = messages.FieldNames()
BATCH_ITEMS = messages.FieldNames("items[{}].message_json", "items[{}].parent_id")


def _check_results_fit(results: Sequence[AppendResult]) -> None:
    """LimitExceeded when the results' ids, parent ids and roles would not fit one response."""
    limit = MAX_BATCH_RESULT_BYTES
    total = results_bytes([result.message.info for result in results], at_most=limit)
    if total > limit:
        raise LimitExceeded(
            f"the results of these {len(results)} messages would take {total} bytes (ids, parent ids and roles), "
            f"more than one response carries (max_batch_result_bytes, {limit}); nothing was written: send them "
            "in smaller batches",
            limit="max_batch_result_bytes",
            limit_value=str(limit),
        )


def _past_results_bound(chain: Sequence[NewRow]) -> bool:
    """Whether a chain's results, were it appended to an empty session, might not fit one
    response (four bytes a character bound them)."""
    characters = sum(len(row.id) + len(row.role) for row in chain) + sum(len(row.id) for row in chain[:-1])
    return 4 * characters + RESULT_OVERHEAD_BYTES * len(chain) > MAX_BATCH_RESULT_BYTES


def _distinct(chain: Sequence[NewRow]) -> bool:
    return len({row.id for row in chain}) == len(chain)


def _fresh_chain_results(chain: Sequence[NewRow]) -> list[AppendResult]:
    """The results of appending `chain`, of distinct ids, to an object with no messages: each
    new, and the parent of the next."""
    return [
        AppendResult(True, MessageView(RowInfo(row.id, row.role, chain[index - 1].id if index else None, 0, 0, 0), ""))
        for index, row in enumerate(chain)
    ]


# A request's count of items alone can tell that it will be refused: each batch result takes at
# least RESULT_OVERHEAD_BYTES of its response, each deleted id ID_OVERHEAD_BYTES of its change
# event. Checked first, before the items are looked at: a 64 MiB AppendMessages of empty items
# held the event loop for about a minute (and 6 GB) before its refusal.
MAX_BATCH_ITEMS = MAX_BATCH_RESULT_BYTES // RESULT_OVERHEAD_BYTES
MAX_DELETE_IDS = MAX_DELETE_IDS_BYTES // ID_OVERHEAD_BYTES
# GetMessages answers ids it finds in request order, read in windows: 5.6 million ids held the
# event loop 6 s. Far more than any page of a conversation.
MAX_GET_IDS = 100_000


def check_batch_length(count: int) -> None:
    """LimitExceeded when an AppendMessages of `count` items could not be answered, whatever they hold."""
    if count > MAX_BATCH_ITEMS:
        raise exceeded(
            f"{count} messages in one batch, whose results could not fit one response (nothing was "
            "written; send them in smaller batches)",
            "max_batch_result_bytes",
            MAX_BATCH_RESULT_BYTES,
            "bytes",
        )


def _check_delete_ids(message_ids: Sequence[str]) -> None:
    """LimitExceeded when a delete's ids would not fit the one change event that carries them."""
    limit = MAX_DELETE_IDS_BYTES
    total = sum(utf8_length(i) + ID_OVERHEAD_BYTES for i in message_ids)
    if total > limit:
        raise LimitExceeded(
            f"the {len(message_ids)} ids of this delete take {total} bytes, more than the change event that "
            f"carries them to subscribers may (max_delete_ids_bytes, {limit}); nothing was deleted: delete "
            "them in smaller batches",
            limit="max_delete_ids_bytes",
            limit_value=str(limit),
        )


class SessionsService:
    """The operations of the contract, one method per RPC."""

    def __init__(
        self,
        registry: ObjectRegistry,
        *,
        reserved_metadata_keys: Sequence[str] = (),
        max_object_key_bytes: int = keys.MAX_OBJECT_KEY_BYTES,
        summarizer: Summarizer | None = None,
        max_query_bytes: int = search_rules.MAX_QUERY_BYTES,
        search_seconds: float = search_rules.DEFAULT_SEARCH_SECONDS,
        max_concurrent_searches: int = search_rules.DEFAULT_CONCURRENT_SEARCHES,
        limits: Limits | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.registry = registry
        self.reserved_metadata_keys = tuple(reserved_metadata_keys)
        self.max_object_key_bytes = max_object_key_bytes
        self.compactor = Compactor(self, summarizer)
        self.max_query_bytes = max_query_bytes
        self.search_seconds = search_seconds
        self.search_slots = search_rules.SearchSlots(max_concurrent_searches)
        self.limits = limits or Limits()
        self.objects = ObjectAdmin(
            registry,
            placement=placement,
            max_object_key_bytes=max_object_key_bytes,
            max_object_bytes=self.limits.max_object_bytes,
            text_limits=stored_text_limits(self.limits),
            read_back=stored_read_back(self.limits),
        )

    def check_names(self, object_key: str, session_id: str) -> None:
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        keys.check_session_id(session_id)

    def object(
        self, object_key: str, *, writing: bool = False, removing: bool = False
    ) -> contextlib.AbstractAsyncContextManager[ObjectStore]:
        """The open object (opened on demand). Writes and removals are refused while the object
        is being moved: a change after the move's snapshot would be lost with the source.
        `writing` also checks the object's size limit, which a removal must pass: removing is
        how a full object gets room again."""
        # Never None: `create` makes the file. `_opened` itself, not a block around it: every
        # call enters one, and each generator-based context manager costs a few microseconds.
        opened = self._opened(object_key, writing=writing, removing=removing, create=True)
        return cast("contextlib.AbstractAsyncContextManager[ObjectStore]", opened)

    def existing_object(
        self, object_key: str, *, writing: bool = False, removing: bool = False
    ) -> contextlib.AbstractAsyncContextManager[ObjectStore | None]:
        """The object, or None when it has no file here. Reads, and removals, of an object never
        written answer as an empty object would, and create nothing: otherwise a `read` token
        could fill the disk with empty objects (one file each, listed by ListObjects). So do
        writes that only make sense in an object already there (one planned from its contents)."""
        return self._opened(object_key, writing=writing, removing=removing, create=False)

    async def publish(self, object_key: str, event: ChangeEvent) -> None:
        """Hands subscribers an event no write carries (a failure in the background), through the
        object's feed alone: no file is opened, or created for an object erased meanwhile."""
        again = functools.partial(self.objects.admit, object_key, writing=False)
        try:
            self.objects.admit(object_key, writing=False)
            async with self.registry.feed(object_key, again) as hub:
                hub.publish([event])
        except SessionsError as exc:  # moved away meanwhile: its subscribers are elsewhere
            log.info("%r: %s event not published: %s", object_key, event.type, exc)

    @contextlib.asynccontextmanager
    async def _opened(
        self, object_key: str, *, writing: bool, removing: bool, create: bool
    ) -> AsyncIterator[ObjectStore | None]:
        self.objects.admit(object_key, writing=writing or removing)
        again = functools.partial(self.objects.admit, object_key, writing=writing or removing)
        opened = self.registry.use(object_key, again) if create else self.registry.use_existing(object_key, again)
        try:
            async with opened as store:
                if writing and store is not None:
                    await check_room(store, 0, self.limits.max_object_bytes)
                yield store
        except (StorageError, ObjectKeyConflict) as exc:
            raise self.objects.open_failure(exc, object_key) from exc
        except StorageFailure as exc:  # found by the domain (a row missing), not by SQLite
            self.objects.note_storage_failure(object_key, "a read", exc.message)
            raise
        except StoredRowUnreadable as exc:
            raise FailedPrecondition(str(exc), reason="INVALID_MESSAGE") from exc
        except InlineTooLarge as exc:
            limit = "max_client_message_bytes" if exc.limit < self.limits.max_assembly_bytes else "max_assembly_bytes"
            if exc.grown is None:
                what = f"message {exc.message_id!r} would read back"
            else:
                what = (
                    f"message {exc.grown[1]!r} of session {exc.grown[0]!r} names an attachment the object did not "
                    f"hold, which message {exc.message_id!r} brings; with it, it would read back"
                )
            raise exceeded(
                f"{what} as {exc.inline_bytes} bytes with its attachments inline; nothing was written",
                limit,
                exc.limit,
                "bytes",
            ) from exc

    def _inline_bound(self, from_client: bool) -> int:
        """The most bytes a message may read back as with its attachments inline: what the
        server takes as one message, and less from a client when its cap is less."""
        return self._inline_limit(from_client)[0]

    def _inline_limit(self, from_client: bool) -> tuple[int, str]:
        """`_inline_bound`, and the name of the limit it is."""
        cap, most = self.limits.max_client_message_bytes, self.limits.max_assembly_bytes
        if from_client and cap and cap <= most:
            return cap, "max_client_message_bytes"
        return most, "max_assembly_bytes"

    def _check_parent(self, parent: Parent, field: str) -> None:
        if parent.kind == "id":
            messages.check_parent_id(parent.message_id, self.limits, field)

    def _prepare(self, text: str, from_client: bool, field: str) -> tuple[messages.Message, messages.PreparedMessage]:
        cap = self.limits.max_client_message_bytes
        if from_client and cap and len(text) > cap // 4 and utf8_length(text) > cap:
            raise exceeded(f"{field} from a client is larger than allowed", "max_client_message_bytes", cap, "bytes")
        message, plain, simple = messages.parse_client_message(text, field=field)
        messages.check_message_sizes(message, self.limits, field)
        prepared = messages.prepare_for_write(
            message,
            from_client=from_client,
            reserved_keys=self.reserved_metadata_keys,
            source_text=text,
            plain=plain,
            simple=simple,
        )
        messages.check_stored_size(prepared, text, *self._inline_limit(from_client), field)
        return message, prepared

    async def _prepared_row(
        self, text: str, from_client: bool, field: str
    ) -> tuple[messages.Message, messages.PreparedMessage, NewRow]:
        def prepare() -> tuple[messages.Message, messages.PreparedMessage, NewRow]:
            message, prepared = self._prepare(text, from_client, field)
            return message, prepared, prepared.row(self._inline_bound(from_client))

        return await messages.prepared_off_loop_if_costly([text], prepare)

    # ── writes ──────────────────────────────────────────────────────────────

    async def append(
        self,
        object_key: str,
        session_id: str,
        text: str,
        parent: Parent,
        *,
        from_client: bool,
        fields: messages.FieldNames = ONE_MESSAGE,
    ) -> AppendResult:
        return (await self.append_many(object_key, session_id, [AppendInput(text, parent, from_client)], fields))[0]

    async def append_many(
        self, object_key: str, session_id: str, items: Sequence[AppendInput], fields: messages.FieldNames = BATCH_ITEMS
    ) -> list[AppendResult]:
        """Appends in order in one transaction; any invalid item rejects the whole batch."""
        self.check_names(object_key, session_id)
        field_name, parent_field = fields.text, fields.parent_id

        def prepare() -> tuple[list[_Staged], list[NewRow | None]]:
            staged: list[_Staged] = []
            for index, item in enumerate(items):
                self._check_parent(item.parent, parent_field.format(index))
                message, prepared = self._prepare(item.text, item.from_client, field_name.format(index))
                # Overlay ids are derived on read: upstream answers inserted=false, writes and emits nothing.
                staged.append((index, message, None if messages.is_overlay_id(prepared.id) else prepared))
            # Built before the transaction: the slices, digest and search text are pure work that
            # would otherwise hold the object's write lock (and, on the writer thread, contend for
            # the interpreter with the event loop).
            return staged, [
                None if prepared is None else prepared.row(self._inline_bound(items[index].from_client))
                for index, _, prepared in staged
            ]

        staged, rows = await messages.prepared_off_loop_if_costly([item.text for item in items], prepare)

        def refused(message: messages.Message) -> AppendResult:
            return AppendResult(False, MessageView(None, jsjson.stringify(message)))

        # New messages under the tail, the common batch, go in one statement; a batch that meets
        # a stored id (a retry, a repeat) goes row by row.
        chain = [row for row in rows if row is not None]
        chained = len(chain) == len(rows) and all(item.parent.kind == "auto" for item in items)

        # Set once the object is open: whether the job also reads the session's policy, which
        # the check for automatic compaction after it needs.
        reads_policy = False

        def run(ctx: WriteContext) -> tuple[list[AppendResult], Policy | None]:
            results = []
            outcomes = append_chain_in(ctx, session_id, chain) if chained else None
            for (index, message, prepared), row in zip(staged, rows, strict=True):
                if prepared is None or row is None:
                    results.append(refused(message))
                    continue
                parent = items[index].parent
                if outcomes is not None:
                    outcome = outcomes[index]
                else:
                    outcome = append_in(ctx, session_id, row, parent, stored_row_ok)
                # A repeat answers with the stored message as a read would: its media put back.
                stored = None if outcome.existing is None else view_of(ctx.conn, outcome.existing, inline=True)
                view = stored or MessageView(
                    outcome.info, outcome.existing.content if outcome.existing is not None else prepared.json
                )
                results.append(AppendResult(outcome.inserted, view))
                ctx.emit(
                    ChangeEvent(
                        "append",
                        session_id,
                        message_json=view.json if stored else as_read_inline(ctx.conn, view.json, row),
                        message_info=outcome.info,
                        inserted=outcome.inserted,
                        parent_kind=parent.kind,
                        parent_id=parent.message_id,
                    )
                )
            # Checked in the job, where parents are known: raising here rolls the batch back.
            _check_results_fit(results)
            inserted_any = any(result.inserted for result in results)
            return results, read_policy(ctx.conn, session_id) if reads_policy and inserted_any else None

        if chained and _past_results_bound(chain) and _distinct(chain) and not self.objects.is_stored(object_key):
            # Known before the object is made: refused in the job, its file would be made and removed.
            _check_results_fit(_fresh_chain_results(chain))
        if all(prepared is None for _, _, prepared in staged):  # nothing to store (or an empty batch)
            self.objects.admit(object_key, writing=True)  # still refused where the object is not ours
            return [refused(message) for _, message, _ in staged]
        inserted: list[paths.AppendedRow] = []

        def noted(done: tuple[list[AppendResult], Policy | None]) -> None:
            results, policy = done
            if policy is not None:
                self.compactor.note_policy(store, session_id, policy)
            large_messages.note_written(
                store, session_id, (row for row, result in zip(rows, results, strict=True) if result.inserted)
            )
            inserted.extend(
                _remembered_row(result.message, prepared)
                for (_, _, prepared), result in zip(staged, results, strict=True)
                if result.inserted and result.message.info is not None and prepared is not None
            )
            if inserted:
                self._note_inserted_appends(store, session_id, inserted)

        async with self.object(object_key, writing=True) as store:
            reads_policy = self.compactor.policy_unknown(store, session_id)
            size = sum(utf8_length(item.text) for item in items)
            results, _ = await store.write(run, size_hint=size, after=noted, grows=size)
            if inserted:
                await self.compactor.after_inserted_append(store, object_key, session_id)
            return results

    async def update(
        self,
        object_key: str,
        session_id: str,
        text: str,
        *,
        from_client: bool,
        fields: messages.FieldNames = ONE_MESSAGE,
    ) -> UpdateResult:
        """Replaces an existing message; found=False (upstream's null) when the id is absent."""
        self.check_names(object_key, session_id)
        _, prepared, row = await self._prepared_row(text, from_client, fields.text)
        if messages.is_overlay_id(prepared.id):
            self.objects.admit(object_key, writing=True)
            return UpdateResult(False, False, None)

        def run(ctx: WriteContext) -> UpdateOutcome:
            outcome = update_in(ctx, session_id, row)
            if outcome.status == "updated":
                note_session_changed(ctx, session_id, frozenset((row.id,)))
                _emit_update(ctx, session_id, prepared.json, row, outcome.info)
            return outcome

        def noted(outcome: UpdateOutcome) -> None:
            if outcome.status != "updated":
                return
            large_messages.note_written(store, session_id, (row,))
            if outcome.info is None:
                forget_estimate(store, session_id)  # where to restate it is not known
            else:
                note_update(store, session_id, _remembered_row(MessageView(outcome.info, prepared.json), prepared))

        async with self.existing_object(object_key, writing=True) as found:
            if found is None:  # nothing to replace: an object is not created to say so
                return UpdateResult(False, False, None)
            store = found
            outcome = await store.write(run, after=noted, grows=utf8_length(text))
        if outcome.status == "missing":
            return UpdateResult(False, False, None)
        return UpdateResult(True, outcome.status == "updated", MessageView(outcome.info, prepared.json))

    async def upsert(
        self,
        object_key: str,
        session_id: str,
        text: str,
        parent: Parent,
        *,
        from_client: bool,
        fields: messages.FieldNames = ONE_MESSAGE,
    ) -> tuple[bool, UpdateResult]:
        """Appends a new id, else updates without re-parenting. Returns (inserted, result)."""
        self.check_names(object_key, session_id)
        self._check_parent(parent, fields.parent_id)
        message, prepared, row = await self._prepared_row(text, from_client, fields.text)
        if messages.is_overlay_id(prepared.id):
            self.objects.admit(object_key, writing=True)
            return False, UpdateResult(False, False, MessageView(None, jsjson.stringify(message)))

        def run(ctx: WriteContext) -> tuple[bool, UpdateResult, Policy | None]:
            if not queries.exists(ctx.conn, session_id, row.id):
                outcome = append_in(ctx, session_id, row, parent, stored_row_ok)
                ctx.emit(
                    ChangeEvent(
                        "append",
                        session_id,
                        message_json=as_read_inline(ctx.conn, prepared.json, row),
                        message_info=outcome.info,
                        inserted=True,
                        parent_kind=parent.kind,
                        parent_id=parent.message_id,
                    )
                )
                policy = read_policy(ctx.conn, session_id) if reads_policy else None  # as append_many's
                return True, UpdateResult(True, False, MessageView(outcome.info, prepared.json)), policy
            updated = update_in(ctx, session_id, row)
            if updated.status == "updated":
                note_session_changed(ctx, session_id, frozenset((row.id,)))
                _emit_update(ctx, session_id, prepared.json, row, updated.info)
            changed = updated.status == "updated"
            return False, UpdateResult(True, changed, MessageView(updated.info, prepared.json)), None

        def noted(outcome: tuple[bool, UpdateResult, Policy | None]) -> None:
            inserted, result, policy = outcome
            if policy is not None:
                self.compactor.note_policy(store, session_id, policy)
            if inserted or result.changed:
                large_messages.note_written(store, session_id, (row,))
            if result.message is None or result.message.info is None:
                if inserted or result.changed:
                    forget_estimate(store, session_id)  # where to restate it is not known
                return
            if inserted:
                self._note_inserted_appends(store, session_id, [_remembered_row(result.message, prepared)])
            elif result.changed:
                note_update(store, session_id, _remembered_row(result.message, prepared))

        async with self.object(object_key, writing=True) as store:
            reads_policy = self.compactor.policy_unknown(store, session_id)
            inserted, result, _ = await store.write(run, after=noted, grows=utf8_length(text))
            if inserted and result.message is not None and result.message.info is not None:
                await self.compactor.after_inserted_append(store, object_key, session_id)
            return inserted, result

    async def delete(self, object_key: str, session_id: str, message_ids: Sequence[str]) -> int:
        """Deletes messages (splicing children); the event carries the ids as passed, even none."""
        self.check_names(object_key, session_id)
        if len(message_ids) > MAX_DELETE_IDS:
            raise exceeded(
                f"{len(message_ids)} ids in one delete, more than the change event that carries them can "
                "(nothing was deleted; delete them in smaller batches)",
                "max_delete_ids_bytes",
                MAX_DELETE_IDS_BYTES,
                "bytes",
            )
        _check_delete_ids(message_ids)
        ids = list(dict.fromkeys(message_ids))
        event = ChangeEvent("delete", session_id, message_ids=tuple(message_ids))
        async with self.existing_object(object_key, removing=True) as store:
            if store is None:  # nothing to delete, and no file made to say so; the event all the same
                await self.publish(object_key, event)
                return 0
            if not ids:
                store.feed.publish([event])
                return 0

            def run(ctx: WriteContext) -> int:
                deleted = delete_in(ctx, session_id, ids)
                if deleted:  # a delete that found none changed nothing a compaction summarizes
                    note_session_changed(ctx, session_id, frozenset(ids))
                ctx.emit(event)
                return deleted

            return await store.write(run, after=lambda _: forget_estimate(store, session_id))

    async def clear(self, object_key: str, session_id: str) -> int:
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key, removing=True) as store:
            if store is None:  # as upstream, an empty session's clear is an event too
                await self.publish(object_key, ChangeEvent("clear", session_id))
                return 0

            def run(ctx: WriteContext) -> int:
                deleted = clear_in(ctx, session_id)
                note_session_changed(ctx, session_id, None)
                ctx.emit(ChangeEvent("clear", session_id))
                return deleted

            return await store.write(run, after=lambda _: forget_estimate(store, session_id))

    def _note_inserted_appends(self, store: ObjectStore, session_id: str, appended: list[paths.AppendedRow]) -> None:
        pushed_out = paths.note_appends(store, session_id, appended)
        self.compactor.note_appends(store, session_id, [row.info for row in appended], pushed_out)

    @contextlib.asynccontextmanager
    async def importer(self, object_key: str, session_id: str) -> AsyncIterator[Importer]:
        """An import session: messages are validated as they arrive and committed in order."""
        self.check_names(object_key, session_id)
        self.objects.admit(object_key, writing=True)  # moved away or moving: refused before any message
        async with contextlib.AsyncExitStack() as opened:

            async def open_store() -> ObjectStore:
                return await opened.enter_async_context(self.object(object_key, writing=True))

            importer = Importer(open_store, session_id, self.limits)
            try:
                yield importer
            finally:
                await importer.finish()

    # ── reads ───────────────────────────────────────────────────────────────

    async def get_message(
        self, object_key: str, session_id: str, message_id: str, *, inline: bool = True
    ) -> MessageView | None:
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                return None
            view = await store.read(
                lambda conn: view_of(conn, queries.get_message(conn, session_id, message_id), inline),
                quick=not large_messages.any_known_large(store, session_id, (message_id,)),
            )
            if view is not None:
                large_messages.note_read(store, session_id, message_id, len(view.json))
            return view

    async def get_messages(
        self, object_key: str, session_id: str, message_ids: Sequence[str], *, inline: bool = True
    ) -> AsyncGenerator[list[MessageView], None]:
        """Found messages in request order, one bounded window (one read) per list."""
        self.check_names(object_key, session_id)
        if len(message_ids) > MAX_GET_IDS:
            raise exceeded(
                f"{len(message_ids)} ids in one read (ask in smaller lists)", "max_get_ids", MAX_GET_IDS, "ids"
            )
        ids = list(dict.fromkeys(message_ids))
        async with self.existing_object(object_key) as store:
            if store is None:
                return
            async for window in history_reads.messages_in_windows(store, session_id, ids, inline):
                yield window

    async def get_latest_leaf(self, object_key: str, session_id: str, *, inline: bool = True) -> MessageView | None:
        """The active leaf, skipping hidden overlay rows towards the root."""
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                return None
            return await store.read(lambda conn: history_reads.latest_leaf(conn, store, session_id, inline), quick=True)

    async def get_branches(
        self, object_key: str, session_id: str, message_id: str, *, inline: bool = True
    ) -> AsyncGenerator[list[MessageView], None]:
        """Direct children in seq order; hidden overlay children are replaced by their own."""
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                return
            async for window in history_reads.branches(store, session_id, message_id, inline):
                yield window

    def history(
        self,
        object_key: str,
        session_id: str,
        *,
        leaf_id: str = "",
        newest_first: bool = False,
        inline: bool = True,
        limit: int = 0,
    ) -> AsyncGenerator[list[MessageView], None]:
        """One root-to-leaf path with overlays applied, root first or newest first, in windows:
        each list is what one read fetched, so a caller can frame it without waiting again.
        `limit` (0: none) stops after that many messages; a newest-first walk reads no further."""
        windows = self._path_windows(object_key, session_id, leaf_id, newest_first, inline, limit)
        return history_reads.first_messages(windows, limit) if limit else windows

    async def _path_windows(
        self, object_key: str, session_id: str, leaf_id: str, newest_first: bool, inline: bool, limit: int
    ) -> AsyncGenerator[list[MessageView], None]:
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                return
            windows = (
                history_reads.from_leaf(store, session_id, leaf_id, inline, limit)
                if newest_first
                else history_reads.from_root(store, session_id, leaf_id, inline)
            )
            async with contextlib.aclosing(windows):  # a reader that stops ends the walk's reads now
                async for window in windows:
                    yield window

    async def recent_history(
        self, object_key: str, session_id: str, max_content_bytes: int, *, leaf_id: str = "", inline: bool = True
    ) -> AsyncGenerator[RecentSummary | list[MessageView], None]:
        """The longest recent suffix whose stored bytes fit the budget, never less than the leaf.
        Yields the summary first, then the messages in windows."""
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                yield RecentSummary(False, 0)
                return
            items = history_reads.recent(store, session_id, max_content_bytes, leaf_id, inline)
            async with contextlib.aclosing(items):
                async for item in items:
                    yield item

    async def row_stats(self, object_key: str, session_id: str, *, leaf_id: str = "") -> list[PathStat]:
        """Per-row stored bytes and token estimates along a path (at most 10,001 rows)."""
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                return []
            # In place for a lone caller, as a root-first read's plan (the same walk, or point
            # reads of a remembered path): one that outlasts a quick read runs again on the executor.
            return await store.read(lambda conn: history_reads.row_stats(conn, store, session_id, leaf_id), quick=True)

    async def read_attachment(self, object_key: str, digest: str) -> AsyncGenerator[tuple[str, int, bytes], None]:
        """A payload as (media type, size, chunk) triples, one stored chunk at a time."""
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        if attachments.pointer_hash(attachments.POINTER_PREFIX + digest) is None:
            raise InvalidArgument("hash must be 64 lowercase hex digits", field="hash")
        async with self.existing_object(object_key) as store:
            read_meta = functools.partial(queries.payload_meta, digest=digest)
            if store is None or (meta := await store.read(read_meta, quick=True)) is None:
                raise NotFound(f"no attachment {digest} in this object", field="hash")
            media_type, size, chunks = meta
            if chunks == 0:
                yield media_type, size, b""
            for index in range(chunks):
                # A read a chunk: the payload can be collected between them (its last reference deleted).
                data = await store.read(lambda conn, i=index: _payload_chunk(conn, digest, i))  # type: ignore[misc]
                if data is None:
                    raise NotFound(
                        f"attachment {digest} was deleted (its last message removed) while it was read; "
                        "the part already sent is incomplete",
                        field="hash",
                    )
                yield media_type, size, data

    async def search_windows(
        self,
        object_key: str,
        session_id: str,
        query: str,
        *,
        limit: int | None = None,
        mode: str = search_rules.PHRASE,
        all_sessions: bool = False,
        tenant: str | None = None,
    ) -> AsyncGenerator[list[SearchHit], None]:
        """Full-text search over message text, best match first (the index is built by the first
        search). The hits are ranked in one read, within the search budget; their texts follow a
        window at a time (50 hits, 4 MiB), as a history read's messages do. `tenant`: who asks
        (opaque; None without tokens), for the fair share of the search slots."""
        self.check_names(object_key, session_id)
        expression = search_rules.fts_expression(query, mode, max_query_bytes=self.max_query_bytes)
        wanted = search_rules.effective_limit(limit)
        async with self.existing_object(object_key) as store:
            if store is None:
                return
            await search_index.ensure_built(store)
            if expression is None or wanted == 0:
                return
            scope = None if all_sessions else session_id
            try:
                async with self.search_slots.taken(time.monotonic() + self.search_seconds, tenant) as slot:
                    deadline = time.monotonic() + self.search_seconds  # its budget runs from here
                    ranked = await slot.run(
                        store.read(
                            lambda conn: queries.search(conn, scope, expression, wanted),
                            quick=_small(store),
                            kind="search",
                            deadline=deadline,
                        )
                    )
            except QueryInterrupted:
                raise LimitExceeded(
                    f"the search took longer than its {self.search_seconds:g} s budget: a query is matched "
                    "against the whole object's index, a search of one session included, and this one matches "
                    "too many of its messages; use rarer words, or raise --search-seconds",
                    limit="search_seconds",
                    limit_value=f"{self.search_seconds:g}",
                ) from None
            except QueryRejected as exc:
                raise InvalidArgument(f"the query could not be run: {exc}", field="query") from None
            start = 0
            while start < len(ranked):
                window = ranked[start : start + WINDOW_ROWS]
                keys = [
                    (rowid, message_id, hit_session, version) for rowid, message_id, _, hit_session, version in window
                ]
                # Point reads by rowid, a window's worth: quick (in place for a lone caller).
                taken, texts = await store.read(
                    lambda conn, k=keys: queries.search_texts(conn, k, WINDOW_BYTES, expression),  # type: ignore[misc]
                    quick=True,
                )
                yield [
                    SearchHit(message_id, role, hit_session, texts[rowid])
                    for rowid, message_id, role, hit_session, _ in window[:taken]
                    if rowid in texts
                ]
                start += taken

    async def subscribe(
        self, object_key: str, session_filter: str | None, resume_after: int, *, progress_seconds: float
    ) -> AsyncGenerator[ChangeEvent | Reset | Progress, None]:
        """An object's change events after commit, in commit order; a Reset when events were
        missed; a Progress when nothing happened for `progress_seconds`."""
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        if session_filter is not None:
            keys.check_session_id(session_filter)
        self.objects.admit(object_key, writing=False)
        again = functools.partial(self.objects.admit, object_key, writing=False)
        try:
            self.registry.refuse_if_damaged(object_key, "subscribe")  # as every call on it
        except StorageError as exc:
            raise self.objects.open_failure(exc, object_key) from None
        # The hub alone: a subscriber holds no file open, and an object never written stays so.
        async with self.registry.feed(object_key, again) as hub:
            cap = self.limits.max_subscribers_per_object
            if hub.subscriber_count >= cap:
                raise exceeded("too many subscribers on this object", "max_subscribers_per_object", cap)
            starts = self.registry.feeds.quiet_starts
            place = resume_after
            if (
                resume_after
                and resume_after <= hub.revision
                and not hub.knows(resume_after)
                and starts.key_of(resume_after) == object_key
            ):
                # The start of a feed gone that carried no event (see QuietStarts), the object
                # not erased, replaced or moved since: a subscriber that had stayed would have
                # been told nothing after it, so it resumes where this feed started, and gets
                # what this feed carried and retains.
                place = hub.start_revision
            try:
                subscription = hub.subscribe(session_filter, place)
            except FeedClosed as exc:
                raise _feed_closed(exc) from None
            if not hub.carried_events:
                starts.note(hub.start_revision, object_key)  # what this stream tells is such a start
            try:
                # Every stream opens so, telling where it starts: everything after this revision
                # follows (a resume: what follows the revision it resumes after, replayed events
                # first). Clients take it for "subscribed", not yet for a stream that works. A
                # resume told to reset opens with the reset: a progress echoing a revision the
                # feed cannot resume from (another object's, one ahead of it) would read as a
                # place to resume from again.
                if not subscription.resets_first:
                    yield Progress(place or hub.revision)
                while True:
                    item = await subscription.next(timeout=progress_seconds)
                    yield Progress(hub.revision) if item is None else item
            except FeedClosed as exc:
                raise _feed_closed(exc) from None
            finally:
                subscription.close()

    async def list_sessions(self, object_key: str, after: str | None, limit: int) -> list[tuple[str, int]]:
        """(session id, message rows) of up to `limit` sessions after the id `after`, in id order."""
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        async with self.existing_object(object_key) as store:
            if store is None:
                return []
            return await store.read(
                lambda conn: queries.sessions_page(conn, after, limit), quick=_small(store), kind="counts"
            )

    async def object_stats(self, object_key: str) -> dict[str, int]:
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        async with self.existing_object(object_key) as store:
            if store is None:
                return dict.fromkeys(queries.OBJECT_COUNTS, 0) | {"file_bytes": 0, "row_writes": 0}
            counts = await store.read(queries.object_counts, quick=_small(store), kind="counts")
            counts["file_bytes"] = store.file_bytes()
            counts["row_writes"] = store.row_writes
            return counts


def _small(store: ObjectStore) -> bool:
    """Whether reads of the whole object may run in place (IN_PLACE_MAX_OBJECT_BYTES)."""
    return store.database_bytes() <= IN_PLACE_MAX_OBJECT_BYTES


@dataclass(frozen=True, slots=True)
class Progress:
    """Nothing happened: the feed is alive at this revision."""

    revision: int


def _payload_chunk(conn: Connection, digest: str, index: int) -> bytes | None:
    """One chunk of a payload; None when the payload is gone. A payload still there without the
    chunk is a damaged store."""
    data = queries.payload_chunk(conn, digest, index)
    if data is None and queries.payload_meta(conn, digest) is not None:
        raise StorageFailure(f"attachment {digest} is missing its chunk {index}: the object's file is damaged")
    return data


def _feed_closed(exc: FeedClosed) -> Unavailable:
    return Unavailable(
        f"the object's change feed closed ({exc}); reconnect and resume",
        reason="OBJECT_MOVING" if exc.moving else "DRAINING",
    )


def _emit_update(ctx: WriteContext, session_id: str, json_text: str, row: NewRow, info: RowInfo | None) -> None:
    message_json = as_read_inline(ctx.conn, json_text, row)
    ctx.emit(ChangeEvent("update", session_id, message_json=message_json, message_info=info))


def _remembered_row(answered: MessageView, prepared: messages.PreparedMessage) -> paths.AppendedRow:
    """A row a write inserted or rewrote, as the path memo counts it (stored JSON bytes; unknown
    with attachments), given the view the write answers with."""
    info = answered.info
    assert info is not None
    if prepared.extraction.references:
        return paths.AppendedRow(info, None)
    text = prepared.stored_json
    # What a read of the row returns is its stored JSON (checked as a read would check it).
    # When that is what the write answers too, the memo takes the answered view, so an encoding
    # the transport makes for the answer serves reads as well (a write that leaves its JSON out
    # of the answer makes none: the first read does).
    view: MessageView | None = None
    if not attachments.may_hold_pointers(text):
        view = answered if answered.json is text else MessageView(info, text)
    return paths.AppendedRow(info, utf8_length(text), view)
