"""ImportMessages: messages validated as they arrive and written in order, in chunks.

Unlike an append, an import keeps the parent and creation time it is given (upstream's
`importMessage`), and is not all or nothing: what arrived before a failure is still written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable

from sessions_server.domain import jsjson, large_messages, messages
from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.compactor import forget_estimate
from sessions_server.domain.errors import FailedPrecondition, InvalidArgument
from sessions_server.domain.limits import Limits, check_room
from sessions_server.domain.views import as_read_inline
from sessions_server.storage import queries
from sessions_server.storage.feed import ChangeEvent
from sessions_server.storage.rows import NewRow, StorageError
from sessions_server.storage.store import ObjectStore, WriteContext, import_all_in

# An import writes its messages in chunks of at most this many (or about this many characters of
# JSON), a job each, and keeps at most IMPORT_PIPELINE_DEPTH chunks waiting for their commits,
# holding at most IMPORT_PIPELINE_BYTES of messages not yet committed (received and waiting, or
# being written): a message larger than that waits for all the import's writes before it, and is
# then the only one the import holds. Writing takes several times a message's size: without the
# bound in bytes, an import of large messages held four of them at once, each in several forms.
IMPORT_CHUNK_MESSAGES = 64
IMPORT_CHUNK_CHARS = 1 << 20
IMPORT_PIPELINE_DEPTH = 4
IMPORT_PIPELINE_BYTES = 4 << 20
IMPORTED = messages.FieldNames(text="json", parent_id="parent_id")


class _ImportChunk:
    """Validated messages waiting to be written together, with their change events."""

    __slots__ = ("created_at_ms", "events", "parents", "releases", "rows", "text_bytes", "text_chars")

    def __init__(self) -> None:
        self.rows: list[NewRow] = []
        self.parents: list[str | None] = []
        self.created_at_ms: list[int] = []
        self.events: list[ChangeEvent] = []
        self.releases: list[Callable[[], None]] = []  # the messages' `release`, once done with them
        self.text_chars = 0
        self.text_bytes = 0  # what the file grows by, about: counted against the object's size limit


class Importer:
    """Validates imported messages as they arrive and writes them in order, in chunks, a job
    each (one statement for a chunk of new plain messages). A message goes to the writer at
    once when none of this import's writes is under way, else it waits for them with those
    that follow, up to a chunk: a slow stream is written message by message as it arrives, a
    fast one in chunks that share commits. The import holds at most IMPORT_PIPELINE_DEPTH
    chunks and IMPORT_PIPELINE_BYTES of messages not yet committed (`pending_bytes`): a
    message that does not fit waits, before it is parsed, for the writes before it, so a larger
    one is the only message the import holds. Whatever was received before a failure is still
    written (`finish`): the import is not all or nothing. Nothing after a failed write is: each
    chunk's job first checks (`_may_write`, in its own transaction) that no chunk before it
    stopped or failed, and that the messages of this import sent in the chunk before it, those
    it wrote last (chunks that only skipped ids stored before may come between) and the parents
    it names are still those messages: a chunk queued behind one that fails writes
    nothing, whatever commits take them, none is written after messages of this import that
    another call removed, and the import answers the first failure. The object is opened (and
    so created) by the first valid message: an import refused before any, or one that carried
    none, changes nothing."""

    def __init__(self, open_store: Callable[[], Awaitable[ObjectStore]], session_id: str, limits: Limits) -> None:
        self._limits = limits
        self._open_store = open_store
        self._store: ObjectStore | None = None
        self._session_id = session_id
        self._chunk = _ImportChunk()
        self._pending: list[asyncio.Future[list[bool] | None]] = []
        self._submitted_ids: tuple[str, ...] = ()  # the ids of the chunk submitted last
        self._chunks_submitted = 0
        # Noted by the writes themselves, in the order they run: the chunk and seq of each
        # message this import wrote, and the first chunk whose write stopped the import or failed.
        self._written: dict[str, tuple[int, int]] = {}
        # The newest chunks that wrote messages, oldest first, and their ids: the messages this
        # import wrote last before a chunk may be several chunks back (those between only skipped).
        self._wrote: list[tuple[int, tuple[str, ...]]] = []
        self._stopped_at: int | None = None
        self.pending_bytes = 0  # UTF-8 bytes of the messages taken and not yet done with (written or not)
        self._stopped = False  # a write failed: nothing more is submitted
        self._reported = False  # its failure was raised
        self.imported = 0
        self.skipped = 0
        self.received = 0

    def kept(self) -> str:
        """What of the import is stored when it ends in an error now: an import is not all or
        nothing, and the caller must learn that what came before stays."""
        if self.received == 1:
            return "the message before it is stored (an import is not all or nothing)"
        if self.received:
            return f"the {self.received} messages before it are stored (an import is not all or nothing)"
        return "nothing of this import is stored"

    async def add(
        self,
        text: str,
        parent_id: str | None,
        created_at_ms: int,
        fields: messages.FieldNames = IMPORTED,
        release: Callable[[], None] | None = None,
    ) -> None:
        """Takes the next message. `release` is called once the import is done with it, however:
        its write committed or failed, it was refused, or nothing after a failure is written (the
        caller's charge for the message lasts until then)."""

        def prepare() -> tuple[messages.PreparedMessage, NewRow]:
            message, plain = messages.parse_message(text, field=fields.text)
            messages.check_message_sizes(message, self._limits, fields.text)
            if parent_id is not None:
                messages.check_parent_id(parent_id, self._limits, fields.parent_id)
            prepared = messages.prepare_for_import(message, plain=plain, source_text=text)
            bound = self._limits.max_assembly_bytes
            messages.check_stored_size(prepared, text, bound, "max_assembly_bytes", fields.text)
            return prepared, prepared.row(bound)

        size = utf8_length(text)
        try:
            if self._pending and self.pending_bytes + size > IMPORT_PIPELINE_BYTES:
                await self._make_room(size)  # before the message is parsed: its forms wait too
            try:
                prepared, row = await messages.prepared_off_loop_if_costly([text], prepare)
            except InvalidArgument as exc:  # which message of the stream, beside its field in the frame
                # An import is not all or nothing: the caller must learn that what came before
                # stays, and how to finish (the importer writes what it took, whatever follows).
                raise InvalidArgument(
                    f"the import's message {self.received} (counting from 0): {exc.message}; {self.kept()}: "
                    "send the import again once this message is fixed, ids already stored are skipped",
                    reason=exc.reason,
                    **exc.metadata,
                ) from None
            if self._store is None:
                self._store = await self._open_store()
            else:
                # Checked as each message arrives, as each append is, with what waits to be written:
                # the object's opening checked only the first, and one stream filled the disk past it.
                await check_room(self._store, self._chunk.text_bytes, self._limits.max_object_bytes)
        except BaseException:
            if release is not None:  # not taken: done with it now
                release()
            raise
        large_messages.note_written(self._store, self._session_id, (row,))  # a skipped id: one slower read
        self.received += 1
        chunk = self._chunk
        chunk.rows.append(row)
        chunk.parents.append(parent_id)
        chunk.created_at_ms.append(jsjson.js_integer(created_at_ms))  # upstream's createdAt is a JS number
        chunk.events.append(
            ChangeEvent(
                "import",
                self._session_id,
                message_json=prepared.json,
                parent_kind="root" if parent_id is None else "id",
                parent_id=parent_id or "",
            )
        )
        if release is not None:
            chunk.releases.append(release)
        chunk.text_chars += len(text)
        chunk.text_bytes += size
        self.pending_bytes += size
        full = len(chunk.rows) >= IMPORT_CHUNK_MESSAGES or chunk.text_chars >= IMPORT_CHUNK_CHARS
        self._account_done()
        if full or not self._pending:
            self._submit()
            if len(self._pending) >= IMPORT_PIPELINE_DEPTH:
                await self._settle(IMPORT_PIPELINE_DEPTH // 2)

    async def _make_room(self, size: int) -> None:
        """Waits, oldest first, for this import's writes until a message of `size` bytes fits
        IMPORT_PIPELINE_BYTES with what waits for its commit, or none is left under way."""
        while self._pending and self.pending_bytes + size > IMPORT_PIPELINE_BYTES:
            await self._settle(1)

    async def wait_for_writes(self) -> None:
        """Waits until none of this import's writes is under way (so the import holds nothing);
        raises the first failure."""
        while self._pending:
            await self._settle(1)

    def release_after(self, release: Callable[[], None]) -> None:
        """Calls `release` once the import is done with every message it has taken so far (a
        charge for several messages, given with none of them)."""
        if self._chunk.rows:
            self._chunk.releases.append(release)
        else:
            self._release_after(release, self._pending)

    def _release_after(self, release: Callable[[], None], writes: list[asyncio.Future[list[bool] | None]]) -> None:
        if under_way := [future for future in writes if not future.done()]:
            under_way[-1].add_done_callback(lambda _: self._release_after(release, under_way))
        else:
            release()

    def _after_write(self, chunk: _ImportChunk, future: asyncio.Future[list[bool] | None]) -> None:
        """Done with the chunk's messages; sends what arrived during this import's writes once
        the last of them is done."""
        self._done_with(chunk)
        if future.cancelled() or future.exception() is not None or future.result() is None:
            self._stopped = True
            return
        if self._chunk.rows and all(pending.done() for pending in self._pending):
            self._submit()

    def _done_with(self, chunk: _ImportChunk) -> None:
        self.pending_bytes -= chunk.text_bytes
        releases, chunk.releases = chunk.releases, []
        for release in releases:
            with contextlib.suppress(Exception):  # each is called, whatever another raised
                release()

    def _submit(self) -> None:
        chunk, self._chunk = self._chunk, _ImportChunk()
        if not chunk.rows:
            return
        if self._stopped:  # after a failed write: nothing more is written
            self._done_with(chunk)
            return
        session_id, store = self._session_id, self._store
        assert store is not None  # opened by the chunk's first message
        before, self._submitted_ids = self._submitted_ids, tuple(dict.fromkeys(row.id for row in chunk.rows))
        index, self._chunks_submitted = self._chunks_submitted, self._chunks_submitted + 1

        def run(ctx: WriteContext) -> list[bool] | None:
            if not self._may_write(ctx, index, before, chunk.parents):
                self._stop_at(index)
                return None
            # New rows only, as appends: no change a compaction planned before must hear of.
            try:
                infos = import_all_in(ctx, session_id, chunk.rows, chunk.parents, chunk.created_at_ms)
            except BaseException:
                self._stop_at(index)
                raise
            self._note_wrote(index, tuple(info.id for info in infos if info is not None))
            for info, event, row in zip(infos, chunk.events, chunk.rows, strict=True):
                if info is not None:
                    self._written[info.id] = (index, info.seq)
                    event.message_info = info
                    if event.message_json is not None:
                        event.message_json = as_read_inline(ctx.conn, event.message_json, row)
                    ctx.emit(event)
            return [info is not None for info in infos]

        def noted(inserted: list[bool] | None) -> None:
            if inserted and any(inserted):  # committed, whether or not the import's caller is still there
                forget_estimate(store, session_id)

        future = asyncio.ensure_future(store.write(run, after=noted, grows=chunk.text_bytes))
        future.add_done_callback(functools.partial(self._after_write, chunk))
        self._pending.append(future)

    def _may_write(self, ctx: WriteContext, index: int, before: tuple[str, ...], parents: list[str | None]) -> bool:
        """Whether chunk `index` may be written, in its write's transaction: no chunk before it
        stopped the import or failed (a chunk queued behind one that stopped found that one's
        ids stored, skipped ones, and wrote its own), and the messages this import wrote that
        the chunk follows are still those very messages (deleted, or deleted and written again
        by another call, they were taken for them): those in the chunk before it, those the last
        chunk that wrote any wrote (the chunks between may only have skipped ids stored before),
        and the parents it names. Messages the import skipped (stored before it) are not its
        own: another call may delete them; nor are what this chunk's own run noted before its
        group's COMMIT failed (it runs again)."""
        if self._stopped_at is not None and self._stopped_at < index:
            return False
        last = next((ids for chunk, ids in reversed(self._wrote) if chunk < index), ())
        written: dict[str, int] = {}
        for message_id in {*before, *last, *(parent for parent in parents if parent is not None)}:
            noted = self._written.get(message_id)
            if noted is not None and noted[0] < index:
                written[message_id] = noted[1]
        return not written or queries.seqs_of(ctx.conn, self._session_id, list(written)) == written

    def _note_wrote(self, index: int, ids: tuple[str, ...]) -> None:
        """Notes what chunk `index` wrote (in its write's run), forgetting what a run of it or of
        a later chunk noted before their group's COMMIT failed (each runs again, in order). A
        group holds at most IMPORT_PIPELINE_DEPTH of this import's chunks, so a chunk run again
        finds the chunk that wrote before it among those kept."""
        kept = [entry for entry in self._wrote if entry[0] < index]
        if ids:
            kept.append((index, ids))
        self._wrote = kept[-(2 * IMPORT_PIPELINE_DEPTH) :]

    def _stop_at(self, index: int) -> None:
        if self._stopped_at is None or index < self._stopped_at:
            self._stopped_at = index

    async def _settle(self, count: int) -> None:
        """Waits for this import's oldest `count` writes and accounts for them."""
        if count:
            await asyncio.wait(self._pending[:count])
        self._account_done()

    def _account_done(self) -> None:
        """Counts this import's finished writes, oldest first, stopping at one still under way
        (each message checks, so the list stays short); raises the first failure, once."""
        while self._pending and self._pending[0].done():
            future = self._pending.pop(0)
            if self._reported or future.cancelled():
                continue  # after the failure: nothing of these was written
            try:
                inserted = future.result()
            except StorageError:
                # Answered by the object's opener (`SessionsService._opened`), as any call's: a
                # damaged file is refused DATA_LOSS, the disk's failures logged.
                self._reported = True
                raise
            except BaseException:
                self._reported = True
                raise
            if inserted is None:  # no write failed before it: another call removed what it had written
                self._reported = True
                raise FailedPrecondition(
                    "messages this import had written were deleted or cleared by another call meanwhile; it "
                    f"stopped there, after {self.imported} messages (some of which that call may have removed): "
                    "send the import again to write the rest (ids stored are skipped)"
                )
            written = sum(inserted)
            self.imported += written
            self.skipped += len(inserted) - written

    async def finish(self) -> None:
        self._submit()
        await self._settle(len(self._pending))
