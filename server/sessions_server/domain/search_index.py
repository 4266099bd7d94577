"""The full-text index's lifecycle: built by an object's first search, in steps.

Upstream creates its FTS5 table and backfills it in one statement at the first search, every other
write to the object waiting for all of it. Here the backfill runs as write jobs of about
BACKFILL_STEP_SECONDS each, its position recorded in the object, so other writes wait for one
step, a write between steps indexes its own message, and a build a close or a restart cut short
goes on at the next search.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from sessions_server.domain import jsjson, messages
from sessions_server.domain.views import stored_row_ok
from sessions_server.storage import queries
from sessions_server.storage.queries import Connection
from sessions_server.storage.store import ObjectStore, WriteContext

# The first search's backfill runs as write jobs of about this long each, so that the object's
# other writes wait for one of them, not for the whole index (a million messages: minutes).
BACKFILL_STEP_SECONDS = 0.05
# Stored JSON a statement of the backfill indexes at most (a larger message alone): about 10 ms.
RUN_BYTES = 256 * 1024
_INDEX_BUILT = "search-index-built"
_INDEX_BUILD = "search-index-build"


async def ensure_built(store: ObjectStore) -> None:
    """Returns once the object's search index exists and holds every stored message: builds it
    (the first search), or finishes a build a close or a restart cut short. Concurrent searches
    share one build, which goes on if they give up (their retry finds it further on)."""
    if store.memo.get(_INDEX_BUILT):
        return
    build = store.memo.get(_INDEX_BUILD)
    if not isinstance(build, asyncio.Future) or (build.done() and (build.cancelled() or build.exception())):
        build = store.memo[_INDEX_BUILD] = asyncio.ensure_future(_build(store))
        build.add_done_callback(_seen)
    await asyncio.shield(build)
    store.memo[_INDEX_BUILT] = True


def _seen(build: asyncio.Future[None]) -> None:
    if not build.cancelled():
        build.exception()  # whoever waited has it; nobody may have


def _index_complete(conn: Connection) -> bool:
    return queries.fts_exists(conn) and queries.backfill_under_way(conn) is None


async def _build(store: ObjectStore) -> None:
    if await store.read(_index_complete, quick=True):
        return
    # A search is a read, served while a move holds the object's writes (the copy it moves
    # builds its own index when first searched).
    await store.write(start_index, derived=True)
    store.search_index_committed()  # from now on every write maintains the index
    while not await store.write(backfill_step, derived=True):
        pass


def start_index(ctx: WriteContext) -> None:
    """Creates the index and records a backfill from the first message (upstream's single
    statement did it all in one write, the object's other writes waiting for all of it)."""
    conn = ctx.conn
    if queries.fts_exists(conn):
        return  # created before: its backfill, if under way, is recorded
    queries.create_fts(conn)
    queries.ensure_fts_lookup(conn)  # the backfill looks up what writes indexed meanwhile
    queries.record_backfill(conn, None)


def backfill_step(ctx: WriteContext) -> bool:
    """Indexes the next stored messages, continuation rows included (upstream's backfill skips
    messages whose first slice is not whole JSON), for about BACKFILL_STEP_SECONDS; True once
    none is left. A message written since the index was created was indexed by its write, as
    it is by upstream's after its index exists, and is passed over. Runs of plain messages go
    in one statement each; a message SQL alone cannot read whole (continuation rows, or not
    stamped by its writer) goes by itself."""
    conn = ctx.conn
    backfill = queries.backfill_under_way(conn)
    if backfill is None:
        return True
    queries.ensure_fts_lookup(conn)  # what writes indexed meanwhile is found by key
    after = backfill.after
    deadline = time.monotonic() + BACKFILL_STEP_SECONDS
    while True:
        page = queries.backfill_page(conn, after)
        if not page:
            queries.end_backfill(conn)
            return True
        for run in _runs(page):
            through = run[-1].key
            if run[0].plain:
                ctx.row_writes += queries.backfill_range(conn, after, through)
            elif _index_one(conn, *through):
                ctx.row_writes += 1
            after = through
            if time.monotonic() >= deadline:  # checked per run: a page of large messages takes long
                queries.record_backfill(conn, after)
                return False


def _runs(page: list[queries.BackfillRow]) -> Iterator[list[queries.BackfillRow]]:
    """The page in key order as runs of consecutive plain messages of at most RUN_BYTES (one
    larger alone), and each other message alone."""
    run: list[queries.BackfillRow] = []
    size = 0
    for row in page:
        if run and (not row.plain or size + row.bytes > RUN_BYTES):
            yield run
            run, size = [], 0
        if not row.plain:
            yield [row]
            continue
        run.append(row)
        size += row.bytes
    if run:
        yield run


def _index_one(conn: Connection, session_id: str, message_id: str) -> bool:
    stored = queries.get_message(conn, session_id, message_id)
    if stored is None or not stored_row_ok(stored) or queries.has_search_row(conn, session_id, message_id):
        return False
    if stored.stamped:
        # Stamped yet not plain: it has continuation rows, which upstream's backfill skips. Its
        # text is taken as its write takes it: SQLite's JSON functions held about 28 times the
        # message's size (an 80 MB message: 2.2 GB), Python's parse about 3 times.
        try:
            text = messages.search_text(jsjson.parse(stored.content))
        except jsjson.JsonInputError:  # its writer parsed it; a file written elsewhere may not
            return queries.backfill_search_row(conn, session_id, message_id, stored.info.role, stored.content)
        return queries.index_search_text(conn, session_id, message_id, stored.info.role, text, replace=False) > 0
    return queries.backfill_search_row(conn, session_id, message_id, stored.info.role, stored.content)
