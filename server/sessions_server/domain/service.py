"""Session semantics over the storage layer: the operations the contract exposes.

Each write prepares its message here (parse, shape rules, sanitize, stamps) and hands storage a
finished row; each read resolves leaves, plans overlays and windows, and filters what upstream
filters. Results are plain records; the transport maps them to the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import operator
import time
from bisect import bisect_right
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, TypeVar

from sessions_server.domain import attachments, jsjson, keys, large_messages, messages, paths
from sessions_server.domain import search as search_rules
from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.compactor import Compactor, Summarizer, forget_estimate, note_session_changed
from sessions_server.domain.errors import (
    FailedPrecondition,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    Unavailable,
    storage_failure,
)
from sessions_server.domain.limits import (
    ID_OVERHEAD_BYTES,
    MAX_BATCH_RESULT_BYTES,
    MAX_DELETE_IDS_BYTES,
    Limits,
    check_size,
    exceeded,
    results_bytes,
    stored_text_limits,
)
from sessions_server.domain.objects import ObjectAdmin
from sessions_server.domain.overlays import OverlaySpan, overlay_id, overlay_message_json, plan_overlays
from sessions_server.domain.placement import Placement
from sessions_server.storage import queries
from sessions_server.storage.feed import COUNTER_LIMIT, ChangeEvent, FeedClosed, Reset
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import (
    MAX_PATH_DEPTH,
    Compaction,
    NewRow,
    OutOfDescriptors,
    Parent,
    PathStat,
    QueryInterrupted,
    QueryRejected,
    RowInfo,
    StorageError,
    StoreClosed,
    StoredMessage,
    StoredRowUnreadable,
    UpdateOutcome,
)
from sessions_server.storage.store import (
    ObjectStore,
    WriteContext,
    append_chain_in,
    append_in,
    clear_in,
    delete_in,
    import_all_in,
    update_in,
)

# Upstream's hydration windows: forward reads fetch at most 50 rows and 4 MiB of stored bytes per
# query (an oversized row alone); newest-first prefix streams use 8-row windows.
WINDOW_ROWS = 50
WINDOW_BYTES = 4 * 1024 * 1024
# Past the first window of a read, windows double up to this many rows (forward reads keep the
# byte bound, and newest-first reads take it on): the first message comes as soon as upstream's
# would, and a long read pays one executor hop per few hundred rows instead of per 50 (or 8).
WINDOW_MAX_ROWS = 400
NEWEST_FIRST_WINDOW_ROWS = 8
# Newest-first walks read this many rows per executor hop at first, doubling up to the maximum,
# so a reader that stops after one message costs a handful of row lookups.
WALK_FIRST_STEPS = 4
WALK_MAX_STEPS = 64
DEFAULT_BATCH_SIZE = 50
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
_ROW_ID = operator.attrgetter("id")
_STORED_BYTES = operator.attrgetter("bytes")
_SPAN_START = operator.attrgetter("start")
# An import writes its messages in chunks of at most this many (or about this many characters of
# JSON), a job each, and keeps at most IMPORT_PIPELINE_DEPTH chunks waiting for their commits.
IMPORT_CHUNK_MESSAGES = 64
IMPORT_CHUNK_CHARS = 1 << 20
IMPORT_PIPELINE_DEPTH = 4
DEFAULT_SEARCH_SECONDS = 2.0
# Messages of more JSON than this are prepared (parsed, checked, sanitized, stamped, sliced) on a
# worker thread. Their walks are Python loops, which there hand the event loop the interpreter
# every few milliseconds instead of holding it for the whole message: a 20 MB message of two
# million parts held every call to every object for about 10 s.
PREPARE_OFF_LOOP_CHARS = 256 * 1024
T = TypeVar("T")
# An append's input as prepared: its index in the call, the parsed message, and what is stored
# (None for a compaction overlay's id, which is written nowhere).
_Staged = tuple[int, "messages.Message", "messages.PreparedMessage | None"]


@dataclass(slots=True)  # not frozen: built per message on every read, and frozen init costs 5x
class MessageView:
    """A message as a read or write returns it: lifted facts (None for synthetic ones) and JSON."""

    info: RowInfo | None
    json: str
    overlay: bool = False  # a synthetic compaction overlay (its info names id and role only)
    # The transport's encoding of this view, kept on it: views remembered by the path memo are
    # shared by every read of the session, so each is encoded once.
    encoded: bytes | None = None


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


@dataclass(frozen=True, slots=True)
class RecentSummary:
    truncated: bool
    total_content_bytes: int


def _stored_row_ok(stored: StoredMessage) -> bool:
    return stored.stamped or messages.is_stored_message(stored.content)


def _view(conn: Any, stored: StoredMessage | None, inline: bool) -> MessageView | None:
    """The readable form of a stored row, attachment payloads restored when `inline`; None for
    rows upstream's reads skip (unparseable). Runs on the read connection's thread."""
    if stored is None or not _stored_row_ok(stored):
        return None
    if inline and attachments.may_hold_pointers(stored.content):
        message = jsjson.parse(stored.content)
        resolved = attachments.resolve(message, lambda digest: queries.load_payload(conn, digest))
        if resolved is not message:
            return MessageView(stored.info, jsjson.stringify(resolved))
    return MessageView(stored.info, stored.content)


def _views_by_id(
    conn: Any, session_id: str, ids: Sequence[str], inline: bool, as_stored: list[MessageView] | None = None
) -> dict[str, MessageView]:
    """One hydration window: the rows by id (one query, plus one for continuations), as views.
    Views that are the stored JSON as is (the same in every attachment mode) are also added to
    `as_stored` when given."""
    found = queries.get_messages(conn, session_id, ids)
    views = {}
    for message_id, stored in found.items():
        if stored.stamped and not attachments.may_hold_pointers(stored.content):
            plain = views[message_id] = MessageView(stored.info, stored.content)  # the common row
            if as_stored is not None:
                as_stored.append(plain)
            continue
        view = _view(conn, stored, inline)
        if view is not None:
            views[message_id] = view
    return views


def _check_message_sizes(message: messages.Message, limits: Limits, field: str) -> None:
    """The id and role travel beside every frame of the message: both are bounded."""
    check_size(message["id"], limits.max_message_id_bytes, "the message id", "max_message_id_bytes", field)
    check_size(message["role"], limits.max_role_bytes, "the role", "max_role_bytes", field)


def _check_parent_id(parent_id: str, limits: Limits, field: str) -> None:
    """A named parent is a message id, bounded as one: its change event carries it as passed."""
    check_size(parent_id, limits.max_message_id_bytes, "the parent id", "max_message_id_bytes", field)


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
        search_seconds: float = DEFAULT_SEARCH_SECONDS,
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
        )

    def check_names(self, object_key: str, session_id: str) -> None:
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        keys.check_session_id(session_id)

    @contextlib.asynccontextmanager
    async def object(
        self, object_key: str, *, writing: bool = False, removing: bool = False
    ) -> AsyncIterator[ObjectStore]:
        """The open object (opened on demand). Writes and removals are refused while the object
        is being moved: a change after the move's snapshot would be lost with the source.
        `writing` also checks the object's size limit, which a removal must pass: removing is
        how a full object gets room again."""
        async with self._opened(object_key, writing=writing, removing=removing, create=True) as store:
            assert store is not None
            yield store

    @contextlib.asynccontextmanager
    async def existing_object(self, object_key: str, *, removing: bool = False) -> AsyncIterator[ObjectStore | None]:
        """The object, or None when it has no file here. Reads, and removals, of an object never
        written answer as an empty object would, and create nothing: otherwise a `read` token
        could fill the disk with empty objects (one file each, listed by ListObjects)."""
        async with self._opened(object_key, writing=False, removing=removing, create=False) as store:
            yield store

    @contextlib.asynccontextmanager
    async def _opened(
        self, object_key: str, *, writing: bool, removing: bool, create: bool
    ) -> AsyncIterator[ObjectStore | None]:
        self.objects.admit(object_key, writing=writing or removing)
        again = functools.partial(self.objects.admit, object_key, writing=writing or removing)
        opened = self.registry.use(object_key, again) if create else self.registry.use_existing(object_key, again)
        try:
            async with opened as store:
                if writing and store is not None and store.cached_file_bytes() > self.limits.max_object_bytes:
                    raise exceeded("the object is full", "max_object_bytes", self.limits.max_object_bytes, "bytes")
                yield store
        except StoreClosed as exc:
            raise Unavailable(
                f"{exc} (replaced or removed, or the server stopping); retry", reason="OBJECT_MOVING"
            ) from exc
        except OutOfDescriptors as exc:  # refused before anything was done, as a busy server refuses
            raise LimitExceeded(str(exc), reason="SERVER_BUSY") from exc
        except StorageError as exc:
            raise storage_failure(str(exc), out_of_space=exc.out_of_space) from exc
        except StoredRowUnreadable as exc:
            raise FailedPrecondition(str(exc), reason="INVALID_MESSAGE") from exc

    def _check_parent(self, parent: Parent, field: str) -> None:
        if parent.kind == "id":
            _check_parent_id(parent.message_id, self.limits, field)

    def _prepare(self, text: str, from_client: bool, field: str) -> tuple[messages.Message, messages.PreparedMessage]:
        cap = self.limits.max_client_message_bytes
        if from_client and cap and len(text) > cap // 4 and utf8_length(text) > cap:
            raise exceeded(f"{field} from a client is larger than allowed", "max_client_message_bytes", cap, "bytes")
        message, plain = messages.parse_message(text, field=field)
        _check_message_sizes(message, self.limits, field)
        prepared = messages.prepare_for_write(
            message, from_client=from_client, reserved_keys=self.reserved_metadata_keys, source_text=text, plain=plain
        )
        return message, prepared

    async def _prepared_row(
        self, text: str, from_client: bool
    ) -> tuple[messages.Message, messages.PreparedMessage, NewRow]:
        def prepare() -> tuple[messages.Message, messages.PreparedMessage, NewRow]:
            message, prepared = self._prepare(text, from_client, "message_json")
            return message, prepared, prepared.row()

        return await _prepared_off_loop_if_large(len(text), prepare)

    # ── writes ──────────────────────────────────────────────────────────────

    async def append(
        self, object_key: str, session_id: str, text: str, parent: Parent, *, from_client: bool
    ) -> AppendResult:
        return (await self.append_many(object_key, session_id, [AppendInput(text, parent, from_client)]))[0]

    async def append_many(self, object_key: str, session_id: str, items: Sequence[AppendInput]) -> list[AppendResult]:
        """Appends in order in one transaction; any invalid item rejects the whole batch."""
        self.check_names(object_key, session_id)
        field_name = "message_json" if len(items) == 1 else "items[{}].message_json"
        parent_field = "parent_id" if len(items) == 1 else "items[{}].parent_id"

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
            return staged, [None if prepared is None else prepared.row() for _, _, prepared in staged]

        staged, rows = await _prepared_off_loop_if_large(sum(len(item.text) for item in items), prepare)

        def refused(message: messages.Message) -> AppendResult:
            return AppendResult(False, MessageView(None, jsjson.stringify(message)))

        # New messages under the tail, the common batch, go in one statement; a batch that meets
        # a stored id (a retry, a repeat) goes row by row.
        chain = [row for row in rows if row is not None]
        chained = len(chain) == len(rows) and all(item.parent.kind == "auto" for item in items)

        def run(ctx: WriteContext) -> list[AppendResult]:
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
                    outcome = append_in(ctx, session_id, row, parent, _stored_row_ok)
                # A repeat answers with the stored message as a read would: its media put back.
                stored = None if outcome.existing is None else _view(ctx.conn, outcome.existing, inline=True)
                view = stored or MessageView(
                    outcome.info, outcome.existing.content if outcome.existing is not None else prepared.json
                )
                results.append(AppendResult(outcome.inserted, view))
                ctx.emit(
                    ChangeEvent(
                        "append",
                        session_id,
                        message_json=view.json,
                        message_info=outcome.info,
                        inserted=outcome.inserted,
                        parent_kind=parent.kind,
                        parent_id=parent.message_id,
                    )
                )
            # Checked in the job, where parents are known: raising here rolls the batch back.
            _check_results_fit(results)
            return results

        if all(prepared is None for _, _, prepared in staged):
            return [refused(message) for _, message, _ in staged]  # nothing to store
        inserted: list[paths.AppendedRow] = []

        def noted(results: list[AppendResult]) -> None:
            large_messages.note_written(
                store, session_id, (row for row, result in zip(rows, results, strict=True) if result.inserted)
            )
            inserted.extend(
                _appended_row(result.message, prepared)
                for (_, _, prepared), result in zip(staged, results, strict=True)
                if result.inserted and result.message.info is not None and prepared is not None
            )
            if inserted:
                self._note_inserted_appends(store, session_id, inserted)

        async with self.object(object_key, writing=True) as store:
            size = sum(utf8_length(item.text) for item in items)
            results = await store.write(run, size_hint=size, after=noted, grows=size)
            if inserted:
                await self.compactor.after_inserted_append(store, object_key, session_id)
            return results

    async def update(self, object_key: str, session_id: str, text: str, *, from_client: bool) -> UpdateResult:
        """Replaces an existing message; found=False (upstream's null) when the id is absent."""
        self.check_names(object_key, session_id)
        _, prepared, row = await self._prepared_row(text, from_client)
        if messages.is_overlay_id(prepared.id):
            return UpdateResult(False, False, None)

        def run(ctx: WriteContext) -> UpdateOutcome:
            outcome = update_in(ctx, session_id, row)
            if outcome.status == "updated":
                note_session_changed(ctx, session_id)
                ctx.emit(ChangeEvent("update", session_id, message_json=prepared.json, message_info=outcome.info))
            return outcome

        def noted(outcome: UpdateOutcome) -> None:
            if outcome.status == "updated":
                forget_estimate(store, session_id)
                large_messages.note_written(store, session_id, (row,))

        async with self.object(object_key, writing=True) as store:
            outcome = await store.write(run, after=noted, grows=utf8_length(text))
        if outcome.status == "missing":
            return UpdateResult(False, False, None)
        return UpdateResult(True, outcome.status == "updated", MessageView(outcome.info, prepared.json))

    async def upsert(
        self, object_key: str, session_id: str, text: str, parent: Parent, *, from_client: bool
    ) -> tuple[bool, UpdateResult]:
        """Appends a new id, else updates without re-parenting. Returns (inserted, result)."""
        self.check_names(object_key, session_id)
        self._check_parent(parent, "parent_id")
        message, prepared, row = await self._prepared_row(text, from_client)
        if messages.is_overlay_id(prepared.id):
            return False, UpdateResult(False, False, MessageView(None, jsjson.stringify(message)))

        def run(ctx: WriteContext) -> tuple[bool, UpdateResult]:
            if not queries.exists(ctx.conn, session_id, row.id):
                outcome = append_in(ctx, session_id, row, parent, _stored_row_ok)
                ctx.emit(
                    ChangeEvent(
                        "append",
                        session_id,
                        message_json=prepared.json,
                        message_info=outcome.info,
                        inserted=True,
                        parent_kind=parent.kind,
                        parent_id=parent.message_id,
                    )
                )
                return True, UpdateResult(True, False, MessageView(outcome.info, prepared.json))
            updated = update_in(ctx, session_id, row)
            if updated.status == "updated":
                note_session_changed(ctx, session_id)
                ctx.emit(ChangeEvent("update", session_id, message_json=prepared.json, message_info=updated.info))
            return False, UpdateResult(True, updated.status == "updated", MessageView(updated.info, prepared.json))

        def noted(outcome: tuple[bool, UpdateResult]) -> None:
            inserted, result = outcome
            if inserted or result.changed:
                large_messages.note_written(store, session_id, (row,))
            if inserted and result.message is not None and result.message.info is not None:
                self._note_inserted_appends(store, session_id, [_appended_row(result.message, prepared)])
            elif result.changed:
                forget_estimate(store, session_id)

        async with self.object(object_key, writing=True) as store:
            inserted, result = await store.write(run, after=noted, grows=utf8_length(text))
            if inserted and result.message is not None and result.message.info is not None:
                await self.compactor.after_inserted_append(store, object_key, session_id)
            return inserted, result

    async def delete(self, object_key: str, session_id: str, message_ids: Sequence[str]) -> int:
        """Deletes messages (splicing children); the event carries the ids as passed, even none."""
        self.check_names(object_key, session_id)
        _check_delete_ids(message_ids)
        ids = list(dict.fromkeys(message_ids))
        event = ChangeEvent("delete", session_id, message_ids=tuple(message_ids))
        async with self.existing_object(object_key, removing=True) as store:
            if store is None:
                return 0
            if not ids:
                store.feed.publish([event])
                return 0

            def run(ctx: WriteContext) -> int:
                deleted = delete_in(ctx, session_id, ids)
                note_session_changed(ctx, session_id)
                ctx.emit(event)
                return deleted

            return await store.write(run, after=lambda _: forget_estimate(store, session_id))

    async def clear(self, object_key: str, session_id: str) -> int:
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key, removing=True) as store:
            if store is None:
                return 0

            def run(ctx: WriteContext) -> int:
                deleted = clear_in(ctx, session_id)
                note_session_changed(ctx, session_id)
                ctx.emit(ChangeEvent("clear", session_id))
                return deleted

            return await store.write(run, after=lambda _: forget_estimate(store, session_id))

    def _note_inserted_appends(self, store: ObjectStore, session_id: str, appended: list[paths.AppendedRow]) -> None:
        paths.note_appends(store, session_id, appended)
        self.compactor.note_appends(store, session_id, [row.info for row in appended])

    @contextlib.asynccontextmanager
    async def importer(self, object_key: str, session_id: str) -> AsyncIterator[Importer]:
        """An import session: messages are validated as they arrive and committed in order."""
        self.check_names(object_key, session_id)
        async with self.object(object_key, writing=True) as store:
            importer = Importer(store, session_id, self.limits)
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
                lambda conn: _view(conn, queries.get_message(conn, session_id, message_id), inline),
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
        ids = list(dict.fromkeys(message_ids))
        async with self.existing_object(object_key) as store:
            if store is None:
                for _ in range(0, len(ids), WINDOW_ROWS):
                    yield []
                return
            for start in range(0, len(ids), WINDOW_ROWS):
                window = ids[start : start + WINDOW_ROWS]
                found = await store.read(
                    lambda conn, w=window: _views_by_id(conn, session_id, w, inline),  # type: ignore[misc]
                    quick=not large_messages.any_known_large(store, session_id, window),
                )
                for message_id, view in found.items():
                    large_messages.note_read(store, session_id, message_id, len(view.json))
                yield [found[message_id] for message_id in window if message_id in found]

    async def get_latest_leaf(self, object_key: str, session_id: str, *, inline: bool = True) -> MessageView | None:
        """The active leaf, skipping hidden overlay rows towards the root."""
        self.check_names(object_key, session_id)

        def run(conn: Any, store: ObjectStore) -> MessageView | None:
            leaf = store.latest_leaf_id(conn, session_id)
            if leaf is None:
                return None
            hidden = _hidden_ids(queries.compactions(conn, session_id))
            while leaf is not None and leaf in hidden:
                _, leaf = queries.parent_of(conn, session_id, leaf)
            return None if not leaf else _view(conn, queries.get_message(conn, session_id, leaf), inline)

        async with self.existing_object(object_key) as store:
            return None if store is None else await store.read(lambda conn: run(conn, store), quick=True)

    async def get_branches(
        self, object_key: str, session_id: str, message_id: str, *, inline: bool = True
    ) -> AsyncGenerator[list[MessageView], None]:
        """Direct children in seq order; hidden overlay children are replaced by their own."""
        self.check_names(object_key, session_id)

        def run(conn: Any) -> list[MessageView]:
            hidden = _hidden_ids(queries.compactions(conn, session_id))

            def expand(parent_id: str, depth: int) -> list[StoredMessage]:
                rows = queries.children(conn, session_id, parent_id)
                if not hidden or depth > MAX_PATH_DEPTH:
                    return rows
                out: list[StoredMessage] = []
                for row in rows:
                    out.extend(expand(row.info.id, depth + 1) if row.info.id in hidden else [row])
                return sorted(out, key=lambda r: r.info.seq)

            views = (_view(conn, row, inline) for row in expand(message_id, 0))
            return [view for view in views if view is not None]

        async with self.existing_object(object_key) as store:
            views = [] if store is None else await store.read(run)
        yield views

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
        return _first_messages(windows, limit) if limit else windows

    async def _path_windows(
        self, object_key: str, session_id: str, leaf_id: str, newest_first: bool, inline: bool, limit: int
    ) -> AsyncGenerator[list[MessageView], None]:
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                return
            if newest_first:
                async for window in self._walk_from_leaf(store, session_id, leaf_id, inline, limit):
                    yield window
                return

            def plan(conn: Any) -> tuple[list[PathStat], list[Compaction]]:
                version = paths.session_version(store, session_id)  # before the snapshot
                leaf = _resolve_leaf(store, conn, session_id, leaf_id)
                if not leaf:  # an empty id as the leaf reads as no leaf, as upstream
                    return [], []
                path = paths.path_stats(store, conn, session_id, leaf, version)
                return path.rows, queries.compactions(conn, session_id)

            stats, records = await store.read(plan)
            async for window in _stream_path(store, session_id, stats, records, inline=inline):
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

            def planned(conn: Any, suffix: paths.PathSuffix) -> _RecentPlan:
                if not suffix.rows:
                    return [], False, 0, []
                # The depth cap hides older rows as the budget does; a path of exactly the cap's
                # length is complete, so only a walk whose oldest row still has a parent counts.
                capped = (
                    suffix.walked > MAX_PATH_DEPTH
                    and suffix.oldest_id is not None
                    and queries.parent_of(conn, session_id, suffix.oldest_id)[1] is not None
                )
                return suffix.rows, suffix.cut or capped, suffix.stored_bytes, queries.compactions(conn, session_id)

            def remembered(conn: Any) -> _RecentPlan | None:
                """From the remembered path, in point reads; None when it is not remembered."""
                leaf = _resolve_leaf(store, conn, session_id, leaf_id)
                if not leaf:  # an empty id as the leaf reads as no leaf, as upstream
                    return [], False, 0, []
                suffix = paths.remembered_suffix(store, session_id, leaf, max_content_bytes)
                return None if suffix is None else planned(conn, suffix)

            def walked(conn: Any) -> _RecentPlan:
                version = paths.session_version(store, session_id)  # before the snapshot
                leaf = _resolve_leaf(store, conn, session_id, leaf_id)
                if not leaf:
                    return [], False, 0, []
                path = paths.path_stats(store, conn, session_id, leaf, version)  # walks, and remembers it
                return planned(conn, paths.suffix_of(path, max_content_bytes))

            plan = await store.read(remembered, quick=True)
            if plan is None:
                plan = await store.read(walked)
            window, truncated, total, records = plan
            yield RecentSummary(truncated, total)
            async for views in _stream_path(store, session_id, window, records, inline=inline):
                yield views

    async def row_stats(self, object_key: str, session_id: str, *, leaf_id: str = "") -> list[PathStat]:
        """Per-row stored bytes and token estimates along a path (at most 10,001 rows)."""
        self.check_names(object_key, session_id)
        async with self.existing_object(object_key) as store:
            if store is None:
                return []

            def run(conn: Any) -> list[PathStat]:
                version = paths.session_version(store, session_id)  # before the snapshot
                leaf = _resolve_leaf(store, conn, session_id, leaf_id)
                return [] if not leaf else paths.path_stats(store, conn, session_id, leaf, version).rows

            return await store.read(run)

    async def read_attachment(self, object_key: str, digest: str) -> AsyncGenerator[tuple[str, int, bytes], None]:
        """A payload as (media type, size, chunk) triples, one stored chunk at a time."""
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        if attachments.pointer_hash(attachments.POINTER_PREFIX + digest) is None:
            raise InvalidArgument("hash must be 64 lowercase hex digits", field="hash")
        async with self.existing_object(object_key) as store:
            if store is None or (meta := await store.read(lambda conn: queries.payload_meta(conn, digest))) is None:
                raise NotFound(f"no attachment {digest} in this object", field="hash")
            media_type, size, chunks = meta
            if chunks == 0:
                yield media_type, size, b""
            for index in range(chunks):
                data = await store.read(lambda conn, i=index: queries.payload_chunk(conn, digest, i))  # type: ignore[misc]
                if data is None:
                    raise FailedPrecondition(f"attachment {digest} lost chunk {index}", reason="STORAGE_FAILURE")
                yield media_type, size, data

    async def search(
        self,
        object_key: str,
        session_id: str,
        query: str,
        *,
        limit: int | None = None,
        mode: str = search_rules.PHRASE,
        all_sessions: bool = False,
    ) -> list[SearchHit]:
        """Full-text search over message text (the index is built by the first search)."""
        self.check_names(object_key, session_id)
        expression = search_rules.fts_expression(query, mode, max_query_bytes=self.max_query_bytes)
        wanted = search_rules.effective_limit(limit)
        async with self.existing_object(object_key) as store:
            if store is None:
                return []
            await _search_index_built(store)
            if expression is None or wanted == 0:
                return []
            scope = None if all_sessions else session_id
            try:
                async with self.search_slots.taken(time.monotonic() + self.search_seconds):
                    deadline = time.monotonic() + self.search_seconds  # its budget runs from here
                    rows = await store.read(lambda conn: queries.search(conn, scope, expression, wanted, deadline))
            except QueryInterrupted:
                raise LimitExceeded(
                    f"the search took longer than its {self.search_seconds:g} s budget; "
                    "narrow the query or raise --search-seconds",
                    limit="search_seconds",
                    limit_value=f"{self.search_seconds:g}",
                ) from None
            except QueryRejected as exc:
                raise InvalidArgument(f"the query could not be run: {exc}", field="query") from None
            return [SearchHit(*row) for row in rows]

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
        # The hub alone: a subscriber holds no file open, and an object never written stays so.
        async with self.registry.feed(object_key, again) as hub:
            cap = self.limits.max_subscribers_per_object
            if hub.subscriber_count >= cap:
                raise exceeded("too many subscribers on this object", "max_subscribers_per_object", cap)
            place = resume_after
            if resume_after & (COUNTER_LIMIT - 1) == 0 and not self.objects.is_stored(object_key):
                # The start of a feed that had no event, on an object still never written: its
                # hub, gone with its last subscriber, had a clock of its own, but nothing can have
                # been missed since (an object written and erased meanwhile is empty again too).
                place = 0
            try:
                subscription = hub.subscribe(session_filter, place)
            except FeedClosed as exc:
                raise _feed_closed(exc) from None
            try:
                if not resume_after:
                    # Tells a live subscriber where it starts: everything after this revision follows.
                    yield Progress(hub.revision)
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
            return await store.read(lambda conn: queries.sessions_page(conn, after, limit))

    async def object_stats(self, object_key: str) -> dict[str, int]:
        keys.check_object_key(object_key, max_bytes=self.max_object_key_bytes)
        async with self.existing_object(object_key) as store:
            if store is None:
                return dict.fromkeys(queries.OBJECT_COUNTS, 0) | {"file_bytes": 0, "row_writes": 0}
            counts = await store.read(queries.object_counts)
            counts["file_bytes"] = store.file_bytes()
            counts["row_writes"] = store.row_writes
            return counts

    async def _walk_from_leaf(
        self, store: ObjectStore, session_id: str, leaf_id: str, inline: bool, limit: int = 0
    ) -> AsyncGenerator[list[MessageView], None]:
        """Leaf to root along the parent pointers, a few rows per read (one statement); switches
        to planned overlays at the first row that ends some compaction (everything after it is
        exact without planning).
        A path the memo holds is streamed from it instead. The first read also takes the walk's
        first steps, so the newest messages come back after one read. With a `limit`, no read
        takes more rows than the messages still wanted. Every read looks up at most
        WALK_MAX_STEPS rows by key, marked quick: a lone caller's walk reads without thread hops."""
        span_ends: set[str] = set()
        hidden: set[str] = set()
        wanted = limit or MAX_PATH_DEPTH + 1

        def walk(conn: Any, first: str, budget: int, depth: int) -> _WalkStep:
            wanted_rows = min(budget, MAX_PATH_DEPTH + 1 - depth)
            taken = queries.ancestors(conn, session_id, first, wanted_rows)
            views: list[MessageView] = []
            for rows, row in enumerate(taken):
                if row.info.id in span_ends:
                    return views, rows, row.info.id, True
                if row.info.id not in hidden:
                    view = _view(conn, row, inline)
                    if view is not None:
                        views.append(view)
            # Fewer rows than asked: the chain reached a root or a missing row, so the path ends.
            current = taken[-1].info.parent_id if taken and len(taken) == wanted_rows else None
            depth += len(taken)
            return views, len(taken), (current if depth <= MAX_PATH_DEPTH else None), False

        def start(conn: Any) -> tuple[str | None, list[Compaction], list[PathStat] | None, _WalkStep | None]:
            leaf = _resolve_leaf(store, conn, session_id, leaf_id)
            records = queries.compactions(conn, session_id)
            # Overlays are planned over the whole path; without any, the newest rows suffice.
            last = 0 if records else wanted
            remembered = paths.remembered_path(store, session_id, leaf, last) if leaf else None
            if not leaf or remembered is not None:
                return leaf, records, remembered, None
            span_ends.update(record.to_message_id for record in records)
            hidden.update(_hidden_ids(records))
            return leaf, records, None, walk(conn, leaf, min(WALK_FIRST_STEPS, wanted), 0)

        next_id, records, remembered, step = await store.read(start, quick=True)
        depth = 0
        if remembered is not None:  # no walk: the path's messages are likely remembered too
            asked = wanted
            async for window in _stream_path(store, session_id, remembered, records, newest_first=True, inline=inline):
                wanted -= len(window)
                yield window
            if records or wanted <= 0 or len(remembered) < asked:
                return
            # Only the newest rows were taken and some did not read as messages: walk on from
            # the oldest of them.
            oldest = remembered[0].id
            next_id = await store.read(lambda conn: queries.parent_of(conn, session_id, oldest)[1], quick=True)
            depth = len(remembered)
        steps = WALK_FIRST_STEPS
        while next_id is not None and depth <= MAX_PATH_DEPTH and wanted > 0:
            taken: _WalkStep
            if step is not None:
                taken, step = step, None
            else:
                read_step = functools.partial(walk, first=next_id, budget=min(steps, wanted), depth=depth)
                taken = await store.read(read_step, quick=True)
            views, walked, next_id, switch = taken
            depth += walked
            # Doubling spares a reader that stops early from reading ahead; a reader that named
            # its count wants every row of it, and each response costs a write round trip.
            steps = WALK_MAX_STEPS if limit else min(steps * 2, WALK_MAX_STEPS)
            if views:
                wanted -= len(views)
                yield views
            if switch and next_id is not None:
                async for window in self._overlaid_prefix(store, session_id, leaf_id, next_id, records, inline):
                    yield window
                return

    async def _overlaid_prefix(
        self,
        store: ObjectStore,
        session_id: str,
        leaf_id: str,
        from_id: str,
        records: list[Compaction],
        inline: bool,
    ) -> AsyncGenerator[list[MessageView], None]:
        def ids(conn: Any) -> list[str]:
            leaf = _resolve_leaf(store, conn, session_id, leaf_id)
            return [] if not leaf else queries.path_ids(conn, session_id, leaf)

        path = await store.read(ids)
        if from_id not in path:
            return
        end = path.index(from_id)
        spans = [span for span in plan_overlays(path, records) if span.end <= end]
        stats = [PathStat(message_id, "", 0, 0) for message_id in path[: end + 1]]
        async for window in _stream_path(
            store, session_id, stats, records, newest_first=True, spans=spans, inline=inline
        ):
            yield window


@dataclass(frozen=True, slots=True)
class Progress:
    """Nothing happened: the feed is alive at this revision."""

    revision: int


def pointer_form(message_json: str) -> str:
    """A message's JSON with inline media as attachment pointers (for pointer-mode readers)."""
    if "base64" not in message_json and '"data"' not in message_json:
        return message_json
    message = jsjson.parse(message_json)
    extracted = attachments.extract(message).message
    return message_json if extracted is message else jsjson.stringify(extracted)


@dataclass(frozen=True, slots=True)
class SearchHit:
    id: str
    role: str
    session_id: str
    content: str


# The first search's backfill runs as write jobs of about this long each, so that the object's
# other writes wait for one of them, not for the whole index (a million messages: minutes).
BACKFILL_STEP_SECONDS = 0.05
_INDEX_BUILT = "search-index-built"
_INDEX_BUILD = "search-index-build"


async def _search_index_built(store: ObjectStore) -> None:
    """Returns once the object's search index exists and holds every stored message: builds it
    (the first search), or finishes a build a close or a restart cut short. Concurrent searches
    share one build, which goes on if they give up (their retry finds it further on)."""
    if store.memo.get(_INDEX_BUILT):
        return
    build = store.memo.get(_INDEX_BUILD)
    if not isinstance(build, asyncio.Future) or (build.done() and (build.cancelled() or build.exception())):
        build = store.memo[_INDEX_BUILD] = asyncio.ensure_future(_build_search_index(store))
        build.add_done_callback(_seen)
    await asyncio.shield(build)
    store.memo[_INDEX_BUILT] = True


def _seen(build: asyncio.Future[None]) -> None:
    if not build.cancelled():
        build.exception()  # whoever waited has it; nobody may have


def _index_complete(conn: Any) -> bool:
    return queries.fts_exists(conn) and queries.backfill_under_way(conn) is None


async def _build_search_index(store: ObjectStore) -> None:
    if await store.read(_index_complete, quick=True):
        return
    await store.write(_start_search_index)
    store.search_index_committed()  # from now on every write maintains the index
    while not await store.write(_backfill_search_step):
        pass


def _start_search_index(ctx: WriteContext) -> None:
    """Creates the index and records a backfill from the first message (upstream's single
    statement did it all in one write, the object's other writes waiting for all of it)."""
    conn = ctx.conn
    if queries.fts_exists(conn):
        return  # created before: its backfill, if under way, is recorded
    queries.create_fts(conn)
    queries.ensure_fts_lookup(conn)  # the backfill looks up what writes indexed meanwhile
    queries.record_backfill(conn, None)


def _backfill_search_step(ctx: WriteContext) -> bool:
    """Indexes the next stored messages, continuation rows included (upstream's backfill skips
    messages whose first slice is not whole JSON), for about BACKFILL_STEP_SECONDS; True once
    none is left. A message written since the index was created was indexed by its write, as
    it is by upstream's after its index exists, and is passed over."""
    conn = ctx.conn
    backfill = queries.backfill_under_way(conn)
    if backfill is None:
        return True
    after = backfill.after
    deadline = time.monotonic() + BACKFILL_STEP_SECONDS
    while True:
        page = queries.messages_page(conn, after)
        if not page:
            queries.end_backfill(conn)
            return True
        for session_id, stored in page:
            if (
                _stored_row_ok(stored)
                and not queries.has_search_row(conn, session_id, stored.info.id)
                and queries.backfill_search_row(conn, session_id, stored.info.id, stored.info.role, stored.content)
            ):
                ctx.row_writes += 1
            after = (session_id, stored.info.id)
            if time.monotonic() >= deadline:  # checked per message: a page of large ones takes long
                queries.record_backfill(conn, after)
                return False


async def _prepared_off_loop_if_large(chars: int, prepare: Callable[[], T]) -> T:
    """`prepare()`, on a worker thread for messages of more than PREPARE_OFF_LOOP_CHARS of JSON."""
    if chars > PREPARE_OFF_LOOP_CHARS:
        return await asyncio.to_thread(prepare)
    return prepare()


class _ImportChunk:
    """Validated messages waiting to be written together, with their change events."""

    __slots__ = ("created_at_ms", "events", "parents", "rows", "text_chars")

    def __init__(self) -> None:
        self.rows: list[NewRow] = []
        self.parents: list[str | None] = []
        self.created_at_ms: list[int] = []
        self.events: list[ChangeEvent] = []
        self.text_chars = 0


class Importer:
    """Validates imported messages as they arrive and writes them in order, in chunks, a job
    each (one statement for a chunk of new plain messages). A message goes to the writer at
    once when none of this import's writes is under way, else it waits for them with those
    that follow, up to a chunk: a slow stream is written message by message as it arrives, a
    fast one in chunks that share commits. Whatever was received before a failure is still
    written (`finish`): the import is not all or nothing."""

    def __init__(self, store: ObjectStore, session_id: str, limits: Limits) -> None:
        self._limits = limits
        self._store = store
        self._session_id = session_id
        self._chunk = _ImportChunk()
        self._pending: list[asyncio.Future[list[bool]]] = []
        self.imported = 0
        self.skipped = 0
        self.received = 0

    async def add(self, text: str, parent_id: str | None, created_at_ms: int) -> None:
        field_name = f"message[{self.received}]"

        def prepare() -> tuple[messages.PreparedMessage, NewRow]:
            message, plain = messages.parse_message(text, field=field_name)
            _check_message_sizes(message, self._limits, field_name)
            if parent_id is not None:
                _check_parent_id(parent_id, self._limits, "parent_id")
            prepared = messages.prepare_for_import(message, plain=plain)
            return prepared, prepared.row()

        prepared, row = await _prepared_off_loop_if_large(len(text), prepare)
        large_messages.note_written(self._store, self._session_id, (row,))  # a skipped id: one slower read
        self.received += 1
        chunk = self._chunk
        chunk.rows.append(row)
        chunk.parents.append(parent_id)
        chunk.created_at_ms.append(created_at_ms)
        chunk.events.append(
            ChangeEvent(
                "import",
                self._session_id,
                message_json=prepared.json,
                parent_kind="root" if parent_id is None else "id",
                parent_id=parent_id or "",
            )
        )
        chunk.text_chars += len(text)
        full = len(chunk.rows) >= IMPORT_CHUNK_MESSAGES or chunk.text_chars >= IMPORT_CHUNK_CHARS
        self._account_done()
        if full or not self._pending:
            self._submit()
            if len(self._pending) >= IMPORT_PIPELINE_DEPTH:
                await self._settle(IMPORT_PIPELINE_DEPTH // 2)

    def _after_write(self, _: asyncio.Future[list[bool]]) -> None:
        """Sends what arrived during this import's writes once the last of them is done."""
        if self._chunk.rows and all(future.done() for future in self._pending):
            self._submit()

    def _submit(self) -> None:
        chunk, self._chunk = self._chunk, _ImportChunk()
        if not chunk.rows:
            return
        session_id, store = self._session_id, self._store

        def run(ctx: WriteContext) -> list[bool]:
            infos = import_all_in(ctx, session_id, chunk.rows, chunk.parents, chunk.created_at_ms)
            if any(info is not None for info in infos):
                note_session_changed(ctx, session_id)
            for info, event in zip(infos, chunk.events, strict=True):
                if info is not None:
                    event.message_info = info
                    ctx.emit(event)
            return [info is not None for info in infos]

        def noted(inserted: list[bool]) -> None:
            if any(inserted):  # committed, whether or not the import's caller is still there
                forget_estimate(store, session_id)

        future = asyncio.ensure_future(store.write(run, after=noted))
        future.add_done_callback(self._after_write)
        self._pending.append(future)

    async def _settle(self, count: int) -> None:
        """Waits for this import's oldest `count` writes and accounts for them."""
        if count:
            await asyncio.wait(self._pending[:count])
        self._account_done()

    def _account_done(self) -> None:
        """Counts this import's finished writes, oldest first, stopping at one still under way
        (each message checks, so the list stays short); raises the error of a failed one."""
        while self._pending and self._pending[0].done():
            future = self._pending.pop(0)
            try:
                inserted = future.result()
            except StorageError as exc:
                raise storage_failure(str(exc), out_of_space=exc.out_of_space) from exc
            written = sum(inserted)
            self.imported += written
            self.skipped += len(inserted) - written

    async def finish(self) -> None:
        self._submit()
        await self._settle(len(self._pending))


def _feed_closed(exc: FeedClosed) -> Unavailable:
    return Unavailable(
        f"the object's change feed closed ({exc}); reconnect and resume",
        reason="OBJECT_MOVING" if exc.moving else "DRAINING",
    )


def _appended_row(answered: MessageView, prepared: messages.PreparedMessage) -> paths.AppendedRow:
    """An inserted row as the path memo counts it (stored JSON bytes; unknown with attachments),
    given the view the write answers with."""
    info = answered.info
    assert info is not None
    if prepared.extraction.references:
        return paths.AppendedRow(info, None)
    text = prepared.stored_json
    # What a read of the new row returns is its stored JSON (checked as a read would check it).
    # When that is what the write answers too, the memo takes the answered view, so an encoding
    # the transport makes for the answer serves reads as well (a write that leaves its JSON out
    # of the answer makes none: the first read does).
    view: MessageView | None = None
    if not attachments.may_hold_pointers(text):
        view = answered if answered.json is text else MessageView(info, text)
    return paths.AppendedRow(info, len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")), view)


# A budgeted read's plan: the rows to read, whether older ones were left out, the path's stored
# bytes in all, and the session's compactions.
_RecentPlan = tuple[list[PathStat], bool, int, list[Compaction]]

# One step of a walk from the leaf: the views read, rows walked, where to go on, and whether the
# walk reached a row that ends a compaction (from which overlays must be planned).
_WalkStep = tuple[list[MessageView], int, str | None, bool]


async def _first_messages(
    windows: AsyncGenerator[list[MessageView], None], limit: int
) -> AsyncGenerator[list[MessageView], None]:
    """The first `limit` messages of `windows`; the reads behind them stop there."""
    async with contextlib.aclosing(windows):
        remaining = limit
        async for window in windows:
            yield window[:remaining]
            remaining -= len(window)
            if remaining <= 0:
                return


def _hidden_ids(records: Sequence[Compaction]) -> set[str]:
    return {overlay_id(record) for record in records}


def _resolve_leaf(store: ObjectStore, conn: Any, session_id: str, leaf_id: str) -> str | None:
    """A non-empty leaf id is used only if it exists in the session (else the read is empty);
    an empty one means the active leaf. Path reads then treat an empty-string leaf (a message
    whose id is "") as no leaf, as upstream's truthiness test does; newest-first walks from it."""
    if leaf_id:
        return leaf_id if queries.exists(conn, session_id, leaf_id) else None
    return store.latest_leaf_id(conn, session_id)


def _windows(
    rows: Sequence[PathStat], max_rows: int, max_bytes: int | None, *, grow_to: int = 0
) -> list[Sequence[PathStat]]:
    """Cuts rows into hydration windows: at most `max_rows` (doubling after each window up to
    `grow_to` when given), and at most `max_bytes` of stored bytes when given, a single
    oversized row standing alone."""
    # Cut points come from running byte totals by bisection: a remembered read of a long path
    # spends no Python per row here.
    totals = [0, *accumulate(map(_STORED_BYTES, rows))] if max_bytes is not None else []
    out: list[Sequence[PathStat]] = []
    start = 0
    while start < len(rows):
        end = min(len(rows), start + max_rows)
        if max_bytes is not None:
            fits = bisect_right(totals, totals[start] + max_bytes, start + 1, end + 1) - 1
            end = max(start + 1, fits)
        out.append(rows[start:end])
        start = end
        max_rows = max(max_rows, min(max_rows * 2, grow_to))
    return out


def _windows_from_end(
    rows: Sequence[PathStat], max_rows: int, max_bytes: int, *, grow_to: int = 0
) -> Iterator[Sequence[PathStat]]:
    """`_windows` of the rows newest first, cut lazily from the end: a reader that stops after a
    few messages pays for their windows only, however long the path."""
    end = len(rows)
    while end > 0:
        start = end - 1
        stored = rows[start].bytes
        floor = max(0, end - max_rows)
        while start > floor and stored + rows[start - 1].bytes <= max_bytes:
            start -= 1
            stored += rows[start].bytes
        yield rows[start:end][::-1]
        end = start
        max_rows = max(max_rows, min(max_rows * 2, grow_to))


async def _stream_path(
    store: ObjectStore,
    session_id: str,
    stats: Sequence[PathStat],
    records: Sequence[Compaction],
    *,
    newest_first: bool = False,
    spans: Sequence[OverlaySpan] | None = None,
    inline: bool = True,
) -> AsyncGenerator[list[MessageView], None]:
    """Streams path rows with overlays collapsed, hydrating one bounded window at a time and
    yielding it whole (an overlay alone); no window is retained after it has been yielded. A
    path whose messages are all remembered comes as one window: it is in memory already."""
    if spans is None:
        spans = plan_overlays(list(map(_ROW_ID, stats)), records) if records else []
    if not spans and not newest_first:
        in_memory = paths.path_views(store, session_id, stats)
        if in_memory is not None:
            yield in_memory  # one window: framing cuts it into responses as they go out
            return
    # A path too large to remember is streamed without filling the memo (and evicting others).
    # Decided at the first storage read: the sum runs over the whole path, which a newest-first
    # read of remembered messages never needs.
    remember: bool | None = None
    segments: list[Compaction | Sequence[PathStat]] = []
    index = 0
    for span in sorted(spans, key=_SPAN_START):
        if span.start < index:
            continue  # inside an overlay already taken
        if span.start > index:
            segments.append(stats[index : span.start])
        segments.append(span.compaction)
        index = span.end + 1
    if index < len(stats):
        segments.append(stats[index:])
    if newest_first:
        segments.reverse()
    for segment in segments:
        if isinstance(segment, Compaction):
            yield [
                MessageView(
                    RowInfo(overlay_id(segment), "assistant", None, 0, 0, 0),
                    overlay_message_json(segment),
                    overlay=True,
                )
            ]
            continue
        windows: Iterable[Sequence[PathStat]] = (
            _windows_from_end(segment, NEWEST_FIRST_WINDOW_ROWS, WINDOW_BYTES, grow_to=WINDOW_MAX_ROWS)
            if newest_first
            else _windows(segment, WINDOW_ROWS, WINDOW_BYTES, grow_to=WINDOW_MAX_ROWS)
        )
        for window in windows:
            ids = list(map(_ROW_ID, window))
            remembered, missing, version = paths.remembered_views(store, session_id, ids)
            if not missing:
                yield remembered  # type: ignore[misc]  # no None left
                continue
            if remember is None:
                remember = paths.fits_session_share(sum(map(_STORED_BYTES, stats)), len(stats))
            as_stored: list[MessageView] | None = [] if remember else None
            found = await store.read(
                lambda conn, i=missing, a=as_stored: _views_by_id(conn, session_id, i, inline, a)  # type: ignore[misc]
            )
            if as_stored:
                paths.remember_views(store, session_id, version, as_stored)
            views = [
                found.get(message_id) if view is None else view
                for message_id, view in zip(ids, remembered, strict=True)
            ]
            kept = [view for view in views if view is not None]  # without the rows reads skip (unparseable)
            if kept:
                yield kept


class BatchMarker:
    """Pairs each message with whether it ends a batch, by upstream's historyBatches rules: close
    the batch before a message that would overflow it, and after one that fills it. Fed a window
    at a time; the last message of a window waits for the next (or `finish`) when its batch could
    still close before it."""

    def __init__(self, batch_size: int, max_batch_bytes: int) -> None:
        self.size_limit = max(1, batch_size)
        self.byte_limit = max(1, max_batch_bytes)
        self.count = 0
        self.used = 0
        self.previous: MessageView | None = None

    def mark(self, views: Sequence[MessageView]) -> list[tuple[MessageView, bool]]:
        out: list[tuple[MessageView, bool]] = []
        for view in views:
            size = utf8_length(view.json)
            if self.previous is not None:
                closes = self.count >= self.size_limit or self.used + size > self.byte_limit
                out.append((self.previous, closes))
                if closes:
                    self.count, self.used = 0, 0
            self.count += 1
            self.used += size
            self.previous = view
            if self.count >= self.size_limit or self.used >= self.byte_limit:
                out.append((view, True))
                self.previous = None
                self.count, self.used = 0, 0
        return out

    def finish(self) -> list[tuple[MessageView, bool]]:
        last, self.previous = self.previous, None
        return [] if last is None else [(last, True)]
