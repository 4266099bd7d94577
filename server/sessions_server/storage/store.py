"""One open object: its writer, its readers, and the per-session tail cache.

Writes to an object are serialized like a Durable Object's single thread, and committed in
groups: jobs that queue while a commit is in flight run together in the next transaction, each
inside its own SAVEPOINT so one failing job rolls back alone, and all of them are answered after
the one COMMIT (one fsync) that makes them durable. When a job's failure ends the transaction
itself (SQLite gives up the whole transaction when the disk fills mid-statement), that job is
refused and the others run again in a new one; when the COMMIT fails (a full disk usually shows
there), each job runs again with a commit of its own. So no job fails for another's sake.
Once they are answered, the writer runs the WAL checkpoint if one is due (storage/wal.py);
writes that arrive meanwhile queue behind it.
Reads run concurrently on their own connections, on the executor.

Blocking SQLite work runs on the executor, with four exceptions, all when the whole server is
quiet: a small write commits, a quick read runs, a file this service opened before opens
(`open_ready`, called by the registry), and an object that wrote nothing closes, on the event
loop's thread. Handing such work to a thread and back costs two thread wake-ups and an
event-loop wake-up from idle, more CPU than the work itself, while there is nobody else to
serve. A call that arrives meanwhile waits for that one short piece of work; under concurrency
everything takes the threads.
- A write commits in place when no other call is in flight (change feeds, which stay open
  idle, do not count), none was at this object's recent writes either, nothing is queued or
  committing on this object, its recent commits were quick and its write lock is free.
  Otherwise it takes the writer thread and commits in a group as above.
- A read the caller marks quick (point reads: a leaf, a walk's steps of up to 64 rows; a small
  object's search or counts) runs in place when no other call is in flight, nothing is queued or
  committing on this object and its recent quick reads of the same kind were quick. It runs on the writer's
  connection, idle then, so a cold object's first read opens no second connection; it never
  waits for a lock and stops once it has run for INLINE_MAX_SECONDS: a read that meets a lock or
  runs out of time runs again on the executor, where reads wait and run as long as they need
  (within their own deadline, if they have one). One that ran out of time sends the next reads
  of its kind on this object to the executor until they are quick there again.
- An open in place never waits for a lock either, and writes nothing: a file that is locked,
  missing, not in WAL mode, needs its schema created or upgraded, or has a large WAL to
  recover opens on the executor.
- A close in place writes nothing: the object's WAL is empty (nothing written since it opened,
  so no checkpoint) and its row count saved; it only closes the connections (SQLite then
  removes the -wal and -shm files). When many objects take turns (an LRU eviction per cold
  request), the close on the executor cost a request 0.3 ms more server CPU.

When SQLite reports the file corrupt or not a database (a read, a job, a commit), the store is
marked `damaged` and the registry told (it quarantines the key, storage/registry.py): the batch
under way is rolled back and every job in it refused, and from then on reads and writes are
refused with ObjectDamaged before they touch the file; checkpoints stop, and the close writes
nothing.

The tail of a session (its newest row and the next seq) is cached, since finding it scans the
session's rows. Jobs see a batch-local view; the shared cache changes only after COMMIT, and a
failed COMMIT drops the batch's view, so nothing cached ever reflects a rolled-back write.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from sessions_server.storage import fdlimit, files, queries, schema, wal
from sessions_server.storage.datadir import make_directories
from sessions_server.storage.feed import ChangeEvent, FeedHub
from sessions_server.storage.paths import FANOUT_LOCK
from sessions_server.storage.rows import (
    AppendOutcome,
    NewRow,
    ObjectDamaged,
    OutOfDescriptors,
    Parent,
    QueryInterrupted,
    RowInfo,
    StorageError,
    StoreClosed,
    StoredMessage,
    StoredRowUnreadable,
    UpdateOutcome,
    damage_or_failure,
    is_damage,
    permission_denied_on,
)
from sessions_server.storage.watches import Changed, ChangeWatch

T = TypeVar("T")

log = logging.getLogger("sessions.storage")
# A batch's commit as the writer thread reports it: each job's (ok, value), and the events to publish.
_Committed = tuple[list[tuple[bool, Any]], list[ChangeEvent]]

MAX_JOBS_PER_COMMIT = 256
MAX_CACHED_TAILS = 8192  # sessions whose tail (active leaf, next seq) a store keeps
MAX_IDLE_READERS = 4
# A write commits on the calling thread only when it is at most this large (the caller's estimate)
# and this object's commits have lately taken at most this long (a slow disk keeps to the thread);
# a quick read runs there only when this object's quick reads have lately taken at most as long.
INLINE_MAX_BYTES = 256 * 1024
INLINE_MAX_SECONDS = 0.005
# ...and only when the calls in flight at this object's recent writes averaged below this: under
# concurrency a write sometimes finds itself alone for a moment, and committing it alone would
# split the group commit that the others are about to join.
INLINE_MAX_RECENT_CALLS = 1.5
PROGRESS_STEPS = 200  # SQLite virtual-machine steps between deadline checks of a read in place
DEADLINE_PROGRESS_STEPS = 10_000  # ... and of a read with a deadline on the executor
# `open_ready` leaves a file with a larger WAL to `open` on the executor: recovering a WAL reads
# all of it, beyond what the event loop's thread should wait for.
READY_OPEN_MAX_WAL_BYTES = 1024 * 1024
RECENT_WEIGHT = 0.25  # of the newest sample in the running estimates below


def recent_estimate(estimate: float, sample: float) -> float:
    """A running estimate moved toward its newest sample."""
    return estimate + (sample - estimate) * RECENT_WEIGHT


def _past(deadline: float) -> bool:
    return time.monotonic() > deadline


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class Tail:
    """The newest row of a session (the active leaf) and the seq the next row gets."""

    leaf_id: str | None
    next_seq: int


_FORGET = Tail(None, -1)  # batch-local marker: the tail must be re-derived


def _tail_in(conn: sqlite3.Connection, session_id: str) -> Tail:
    """The session's tail as `conn` sees it: its max-seq row (none: an empty session)."""
    newest = queries.newest_row(conn, session_id)
    return Tail(newest[0], newest[1] + 1) if newest else Tail(None, 1)


def now_ms() -> int:
    return int(time.time() * 1000)


class WriteContext:
    """What a write job sees: the writer connection inside the open transaction, and tails."""

    def __init__(self, conn: sqlite3.Connection, shared_tails: dict[str, Tail]) -> None:
        self.conn = conn
        self._shared = shared_tails
        self.pending_tails: dict[str, Tail] = {}
        self.row_writes = 0
        self.events: list[ChangeEvent] = []
        # Sessions changed other than by appends, uncommitted: what each job changed (`Changed`).
        self.changed_sessions: dict[str, Changed] = {}

    def tail(self, session_id: str) -> Tail:
        tail = self.pending_tails.get(session_id) or self._shared.get(session_id)
        if tail is None or tail is _FORGET:
            tail = _tail_in(self.conn, session_id)
            self.pending_tails[session_id] = tail
        return tail

    def set_tail(self, session_id: str, tail: Tail) -> None:
        self.pending_tails[session_id] = tail

    def forget_tail(self, session_id: str) -> None:
        self.pending_tails[session_id] = _FORGET

    def emit(self, event: ChangeEvent) -> None:
        """Queues a change event; it is published only if this job's changes commit."""
        self.events.append(event)

    def note_changed(self, session_id: str, changed: Changed) -> None:
        """The session changed other than by an append: `changed` names the messages updated or
        deleted (None: everything). Watches learn it once this job commits."""
        noted = self.changed_sessions.get(session_id, frozenset())
        self.changed_sessions[session_id] = None if noted is None or changed is None else noted | changed

    def touched(self, watch: ChangeWatch, ids: Collection[str]) -> bool:
        """Whether a change since `watch` began may have touched any of `ids`: in a commit since,
        or in this transaction (a job before this one in it, or this one so far)."""
        pending = self.changed_sessions.get(watch.session_id, frozenset())
        return pending is None or not pending.isdisjoint(ids) or watch.touches(ids)


class _RunAgain(Exception):
    """A read in place met another connection's lock, or ran out of time; it runs again on the
    executor."""


RewriteTurn = Callable[[], contextlib.AbstractAsyncContextManager[None]]
"""What a rewrite holds while it waits for the writer and runs (`ObjectStore.rewrite_compactly`)."""


@dataclass
class _Rewrite:
    """A rewrite asked for (`ObjectStore.rewrite_compactly`), and the callers waiting for it."""

    scratch_dir: Path
    done: asyncio.Future[None]
    waiters: int = 1
    turn: asyncio.Future[None] | None = None  # the task taking its turn (`_take_turn`)
    queued: bool = False  # has its turn: the writer runs it
    begun: bool = False


async def _to_its_end(done: asyncio.Future[None]) -> None:
    """Waits for `done` whatever cancels the waiter meanwhile; its outcome is left unraised (the
    waiter was cancelled, and is told that)."""
    while not done.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(done)
    if not done.cancelled():
        done.exception()  # retrieved


@dataclass
class _Job:
    run: Callable[[WriteContext], Any]
    future: asyncio.Future[Any]
    after: Callable[[Any], None] | None = None
    taken: bool = False  # into a commit: from then on it is carried out, its caller there or not


class ObjectStore:
    """An open object file. Create with `ObjectStore.open` (blocking; call on the executor) or
    `ObjectStore.open_ready`."""

    def __init__(
        self,
        object_key: str,
        path: Path,
        writer: sqlite3.Connection,
        executor: Executor,
        feed: FeedHub | None = None,
        calls_in_flight: Callable[[], int] | None = None,
        *,
        commit_executor: Executor | None = None,
    ) -> None:
        self.object_key = object_key
        self.path = path
        self._writer = writer
        self._writer_waits_for_locks = True  # the connection's busy timeout is BUSY_TIMEOUT_MS
        self._executor = executor
        # Commits and checkpoints: a pool of their own, so that reads filling every thread of
        # `executor` (200 history streams) do not hold other objects' writes (p99 5.5 s).
        self._commit_executor = commit_executor or executor
        self._calls_in_flight = calls_in_flight
        self._recent_calls = 1.0  # running estimate of the calls in flight at this object's writes
        self._commit_seconds = 0.0  # running estimate of one commit cycle's wall time
        self.inline_writes = 0  # writes run (and committed, unless they failed) on the calling thread
        self._quick_read_seconds: dict[str, float] = {}  # running estimate of a quick read's wall time, by kind
        self.inline_reads = 0  # quick reads answered on the calling thread
        self.inline_closes = 0  # closes run on the calling thread
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._close_hooks: list[Callable[[], None]] = []
        self._tails: dict[str, Tail] = {}
        self._tails_lock = threading.Lock()
        self._commits = 0  # bumped after every commit that may move a tail
        # Odd from just before a COMMIT until the commit's `after` bookkeeping has run on the
        # event loop (`_settle`), even otherwise: see `memo_epoch`.
        self._memo_epoch = 0
        # Per read connection in a read (by id): `_commits` as the read began, before its snapshot.
        self._begun_at: dict[int, int] = {}
        self._queue: list[_Job] = []
        # The rewrite asked for and not begun (`rewrite_compactly`), which every caller arriving
        # meanwhile shares; once it has its turn (`queued`) it runs on the writer between two
        # commits.
        self._rewrite: _Rewrite | None = None
        # The writer's last turn was a rewrite: the writes queued meanwhile go before the next.
        self._rewrote_last = False
        self._writer_task: asyncio.Task[None] | None = None
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        # Called as each write is queued; raises to refuse it (a move in progress: the snapshot
        # must hold every write the source accepted).
        self.write_gate: Callable[[], None] | None = None
        self._row_writes_saved = 0
        self._size_cache = (0.0, 0)  # (monotonic time, bytes): writes check the size limit often
        self._grown_since_measured = 0  # bytes writes queued since, by their callers' estimates
        self._grown = 0  # bytes writes ever queued, by the same estimates
        self._in_use_cache = (-1, 0, 0)  # (`_commits`, bytes in use, `_grown`) when last read
        self.users = 0  # in-flight calls holding this store open (registry bookkeeping)
        self.idle = asyncio.Event()  # set whenever `users` drops to zero
        self.row_writes = 0
        self.feed = feed if feed is not None else FeedHub()  # the registry's: it outlives a close
        self.memo: dict[str, Any] = {}  # per-session derived state the domain keeps (token estimates)
        self._wal_index: wal.WalIndex | None = None  # None: SQLite checkpoints inside commits
        self._checkpoints = wal.CheckpointPolicy()
        self.checkpoints = 0  # checkpoints this store ran after answering writes
        self._quiet_trim = wal.QuietTrim()
        self._trim_at: int | None = None  # a WAL trim is due, decided at this commit count
        self._trim_kind: str | None = None  # wal.TRUNCATE or wal.COPY
        self.wal_trims = 0  # WAL files this store emptied while quiet
        self.rewrites = 0  # rewrites this store ran (`rewrite_compactly`), failed ones included
        # Set once SQLite reported the file damaged (`_failed`): from then on every read and
        # write is refused without touching the file, and the close writes nothing to it.
        self.damaged: ObjectDamaged | None = None
        # Told of the damage as it is found, on whichever thread found it (the registry keeps
        # the object refused after this store closes).
        self.on_damage: Callable[[ObjectDamaged], None] | None = None
        # This store's open made the file: while no commit has followed (`commits`), the object
        # holds nothing a write put there, and a registry told to (`discard_unwritten`) removes
        # it when its last user leaves: a first write refused as it ran leaves no object behind.
        self.created = False

    @classmethod
    def open(
        cls,
        object_key: str,
        path: Path,
        executor: Executor,
        feed: FeedHub | None = None,
        calls_in_flight: Callable[[], int] | None = None,
        *,
        commit_executor: Executor | None = None,
        staging: Path | None = None,
    ) -> ObjectStore:
        """Opens (creating if needed) the object's file. `calls_in_flight` counts the requests
        the server is handling, the caller's included (see the module docstring). A new file is
        written in `staging` and renamed into place (`files.stage_new_object_file`); without
        `staging`, SQLite makes it and runs the schema's DDL in it."""
        staged = None if staging is None or path.exists() else files.stage_new_object_file(path, staging)
        created = False
        with FANOUT_LOCK:  # the directories and the file in them, with no erase beside it between
            if staged is None:
                make_directories(path.parent)  # the file's own name: SQLite syncs its directory
            else:
                created = files.install_new_object_file(staged, path)
            conn = _connect_writer(path, schema.BUSY_TIMEOUT_MS)
        try:
            if created:
                schema.record_new_object(conn, object_key)
            else:
                schema.initialize(conn, object_key)
            store = cls._around_writer(object_key, path, conn, executor, feed, calls_in_flight, commit_executor)
            store.created = created
            return store
        except BaseException:
            conn.close()
            raise

    @classmethod
    def open_ready(
        cls,
        object_key: str,
        path: Path,
        executor: Executor,
        feed: FeedHub | None = None,
        calls_in_flight: Callable[[], int] | None = None,
        *,
        commit_executor: Executor | None = None,
    ) -> ObjectStore | None:
        """`open` for a file this service opened before, short enough to run in place: it writes
        nothing and never waits for a lock. None when the file is missing, needs its schema
        created or upgraded, is not in WAL mode, is locked, or has a large WAL (after a crash,
        the first open reads all of it to recover): then `open` it."""
        if not path.exists() or _wal_bytes(path) > READY_OPEN_MAX_WAL_BYTES:
            return None
        conn = _connect_writer(path, 0)
        try:
            if not schema.is_ready(conn, object_key, busy_timeout_ms=0):
                conn.close()
                return None
            store = cls._around_writer(object_key, path, conn, executor, feed, calls_in_flight, commit_executor)
        except sqlite3.Error as exc:
            conn.close()
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return None
            raise
        except BaseException:
            conn.close()
            raise
        store._writer_waits_for_locks = False
        return store

    @classmethod
    def _around_writer(
        cls,
        object_key: str,
        path: Path,
        conn: queries.ObjectConnection,
        executor: Executor,
        feed: FeedHub | None,
        calls_in_flight: Callable[[], int] | None,
        commit_executor: Executor | None,
    ) -> ObjectStore:
        """The store of an initialized file, around its writer connection (the caller closes
        `conn` if this raises)."""
        row_writes = schema.read_row_writes(conn)
        conn.creates_fts = True  # this connection becomes the writer, the only one that creates it
        queries.fts_exists(conn)  # outside any transaction: remembered either way
        store = cls(object_key, path, conn, executor, feed, calls_in_flight, commit_executor=commit_executor)
        store.row_writes = store._row_writes_saved = row_writes
        store._wal_index = wal.WalIndex.open(path)
        if store._wal_index is not None:
            conn.execute(f"PRAGMA wal_autocheckpoint = {wal.BACKSTOP_FRAMES}")
        return store

    # ── writes ──────────────────────────────────────────────────────────────

    async def write(
        self,
        run: Callable[[WriteContext], T],
        *,
        size_hint: int | None = None,
        after: Callable[[T], None] | None = None,
        grows: int = 0,
        derived: bool = False,
    ) -> T:
        """Runs `run` inside the object's write transaction; returns after COMMIT.

        `size_hint` is the caller's estimate of the bytes the job writes, if it knows; without
        one the job always runs on the writer thread. `run` may run again (when a job sharing
        its transaction made it fail), so it changes nothing outside `ctx`. `after` is given the
        job's result once it committed, on the event loop's thread, before anyone is answered:
        also when the caller was cancelled after a commit took the job (the commit goes on
        without it), so what the server remembers of the object is brought up to date there,
        not by the caller. A job whose caller is cancelled before a commit takes it is dropped.
        `grows`: about how many bytes the job adds to the file, counted by `cached_file_bytes`
        until the file is measured again. `derived`: the job writes only what is derived from
        the rows (the search index), which `write_gate` lets through: a copy made without it
        makes it again when needed."""
        if self._closed:
            raise StoreClosed("the object was closed while this call used it")
        if self.damaged is not None:
            raise self.damaged.again("write")
        if self.write_gate is not None and not derived:
            self.write_gate()  # raises to refuse: checked as the job is queued, not before
        self._grown_since_measured += grows
        self._grown += grows
        loop = asyncio.get_running_loop()
        job = _Job(run, loop.create_future(), after)
        if self._may_commit_here(size_hint) and self._begin_here():
            try:
                outcomes, events = self._commit_batch([job], begun=True)
            except BaseException as exc:
                outcomes, events = self._abandon([job], f"storage failed, nothing was written: {exc}", exc), []
            self.inline_writes += 1
            self._settle([job], outcomes, events)
            if self._checkpoints.due:
                self._start_writer(loop)  # after this write's answer, not before it
            return cast(T, job.future.result())
        self._queue.append(job)
        self._start_writer(loop)
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if not job.taken:
                # The caller went (cancelled, or past its deadline) before a commit took its job:
                # nothing of it is written, so it is dropped, not committed for nobody. Under
                # overload that was most of the queue: 59% of the rows written in one run were
                # of callers already answered DEADLINE_EXCEEDED, and the rest waited behind them.
                job.future.cancel()
            raise

    def _start_writer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = loop.create_task(self._drain())

    def _may_commit_here(self, size_hint: int | None) -> bool:
        if size_hint is None or self._calls_in_flight is None:
            return False
        calls = self._calls_in_flight()
        self._recent_calls = recent_estimate(self._recent_calls, calls)
        return (
            calls <= 1
            and self._recent_calls < INLINE_MAX_RECENT_CALLS
            and size_hint <= INLINE_MAX_BYTES
            and not self._writing
            and self._commit_seconds <= INLINE_MAX_SECONDS
        )

    def _begin_here(self) -> bool:
        """Starts the write transaction without waiting for another connection's lock (a
        replicator's checkpoint, say): the event loop must not block on it; False if taken."""
        conn = self._writer
        try:
            self._writer_waits(False)
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False
        return True

    def _writer_waits(self, waits: bool) -> None:
        """Whether the writer's statements wait for another connection's lock (BUSY_TIMEOUT_MS)
        or give up at once; the PRAGMA runs only when that changes."""
        if self._writer_waits_for_locks != waits:
            self._writer.execute(f"PRAGMA busy_timeout = {schema.BUSY_TIMEOUT_MS if waits else 0}")
            self._writer_waits_for_locks = waits

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # A due checkpoint goes before the next batch, as SQLite's own would (inside the
            # commit that made it due): under steady load the queue is never empty, and a
            # checkpoint that waited for that would leave the WAL to grow to the backstop.
            if self._checkpoints.due and not self._closed:
                try:
                    await loop.run_in_executor(self._commit_executor, self._checkpoint)
                except RuntimeError as exc:  # the executor shut down; queued writes fail below
                    log.warning("object %r: WAL checkpoint not run: %s", self.object_key, exc)
                    self._checkpoints.due = False
            elif self._trim_at is not None and not self._queue:
                trim_at, self._trim_at = self._trim_at, None
                if trim_at == self._commits and not self._closed:  # still quiet
                    # COPY: the PASSIVE checkpoint, which waits for no reader (nor for a replicator's)
                    trim = self._truncate_wal if self._trim_kind == wal.TRUNCATE else self._checkpoint
                    try:
                        await loop.run_in_executor(self._commit_executor, trim)
                    except RuntimeError as exc:  # the executor shut down
                        log.warning("object %r: WAL not checkpointed: %s", self.object_key, exc)
            elif self._rewrite is not None and self._rewrite.queued and not (self._rewrote_last and self._queue):
                # Before the queue (under steady writes it is never empty), but never twice in
                # a row while writes wait: rewrites asked for back to back shut writes out.
                rewrite, self._rewrite = self._rewrite, None
                rewrite.begun = self._rewrote_last = True
                try:
                    await loop.run_in_executor(self._commit_executor, self._rewrite_blocking, rewrite.scratch_dir)
                except Exception as exc:
                    if not rewrite.done.done():
                        rewrite.done.set_exception(exc)
                else:
                    if not rewrite.done.done():
                        rewrite.done.set_result(None)
            elif self._queue:
                self._rewrote_last = False
                taken = self._queue[:MAX_JOBS_PER_COMMIT]
                del self._queue[: len(taken)]
                batch = [job for job in taken if not job.future.cancelled()]  # callers still there
                if not batch:
                    continue
                for job in batch:
                    job.taken = True
                commit: asyncio.Future[_Committed] | None = None
                try:
                    commit = loop.run_in_executor(self._commit_executor, self._commit_batch, batch)
                    outcomes, events = await asyncio.shield(commit)
                except asyncio.CancelledError:
                    # This task cancelled (the loop closing): the commit goes on on its thread, and
                    # its outcome answers the batch once it is done; a rollback from here would
                    # run under it, and could deny a commit that happens.
                    assert commit is not None  # submitting it does not wait
                    commit.add_done_callback(functools.partial(self._settle_finished, batch))
                    raise
                except Exception as exc:
                    outcomes, events = self._abandon(batch, f"storage failed, nothing was written: {exc}", exc), []
                self._settle(batch, outcomes, events)
                # The jobs hold their messages (a large one in several forms): not through the
                # checkpoint or the wait for the next batch that may follow.
                del taken, batch, job, commit, outcomes, events
            else:
                return

    async def rewrite_compactly(self, scratch_dir: Path, turn: RewriteTurn) -> None:
        """Rewrites the file without its free pages (and its search index merged), on the writer
        between two commits: writes queued meanwhile wait for it, reads go on and find the same
        rows before and after. The new pages go in by one commit, so a crash leaves the object
        as it was or rewritten; the copy they come from is made in `scratch_dir` and removed.

        A rewrite first takes its `turn` (the caller's: a slot among the server's rewrites, room
        on the disk), held until it ends, and is queued for the writer then. Callers that ask
        while one waits for its turn or the writer share it (each finds the file rewritten after
        it asked). A caller cancelled before the rewrite begins withdraws (the rewrite, and its
        turn, are dropped when no one else waits for it); once it has begun, the caller waits
        for its end, and is cancelled then."""
        if self._closed:
            raise StoreClosed("the object was closed while this call used it")
        if self.damaged is not None:
            raise self.damaged.again("rewrite")
        rewrite = self._rewrite
        if rewrite is None:
            loop = asyncio.get_running_loop()
            rewrite = self._rewrite = _Rewrite(scratch_dir, loop.create_future())
            rewrite.turn = asyncio.ensure_future(self._take_turn(rewrite, turn))
        else:
            rewrite.waiters += 1
        try:
            await asyncio.shield(rewrite.done)
        except asyncio.CancelledError:
            rewrite.waiters -= 1
            if rewrite.begun:
                await _to_its_end(rewrite.done)
            elif rewrite.waiters == 0 and self._rewrite is rewrite:
                self._rewrite = None
                rewrite.done.cancel()
                if rewrite.turn is not None:
                    rewrite.turn.cancel()
            raise

    async def _take_turn(self, rewrite: _Rewrite, turn: RewriteTurn) -> None:
        """Takes the rewrite's turn, queues it for the writer, and holds the turn until it ends;
        a turn refused (no room), or a store closed or found damaged meanwhile, fails it."""
        try:
            async with turn():
                if self._closed:
                    raise StoreClosed("the object was closed while this call used it")
                if self.damaged is not None:
                    raise self.damaged.again("rewrite")
                rewrite.queued = True
                self._start_writer(asyncio.get_running_loop())
                await _to_its_end(rewrite.done)  # withdrawn (cancelled) before it began, or done
        except asyncio.CancelledError:
            raise  # withdrawn while it waited for its turn
        except BaseException as exc:
            if self._rewrite is rewrite:
                self._rewrite = None
            if not rewrite.done.done():
                rewrite.done.set_exception(exc)

    def _rewrite_blocking(self, scratch_dir: Path) -> None:
        if self.damaged is not None:  # found while it waited its turn: nothing more goes in
            raise self.damaged.again("rewrite")
        self.rewrites += 1
        conn = self._writer
        copy: Path | None = None
        try:
            self._writer_waits(True)
            conn.execute("BEGIN IMMEDIATE")
            queries.merge_search_index(conn)
            conn.execute("COMMIT")
            copy = files.snapshot_object(self.path, scratch_dir, self.row_writes)  # only the pages in use
            with contextlib.closing(files.open_read_only(copy)) as pages:
                pages.backup(conn)
            # The WAL now holds every page of the object: copied back and emptied at once, the
            # file shrinks to them (later, if a reader such as a replicator holds it back).
            self._writer_waits(False)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except (sqlite3.Error, StorageError) as exc:
            self._roll_back()
            raise self._failed(exc, f"the object could not be rewritten, it is as it was: {exc}", "rewrite") from exc
        finally:
            if copy is not None:
                copy.unlink(missing_ok=True)
            self._forget_tails()  # caches keyed by the commit count see a new one
        if self._wal_index is not None:
            self._checkpoints.after_checkpoint(self._wal_index.frames()[0])

    def _settle_finished(self, batch: list[_Job], commit: asyncio.Future[_Committed]) -> None:
        """Answers a batch whose commit finished after the writer task was cancelled."""
        failure = asyncio.CancelledError() if commit.cancelled() else commit.exception()
        if failure is not None:
            self._settle(batch, self._abandon(batch, f"storage failed, nothing was written: {failure}", failure), [])
        else:
            self._settle(batch, *commit.result())

    def _checkpoint(self) -> None:
        """The WAL checkpoint SQLite would have run inside the last commit (see storage/wal.py)."""
        assert self._wal_index is not None
        if self.damaged is not None:  # nothing more goes into a damaged file
            self._checkpoints.due = False
            return
        try:
            self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            self._failed(exc, "", "checkpoint")
            log.warning("object %r: WAL checkpoint failed: %s", self.object_key, exc)
        self.checkpoints += 1
        self._checkpoints.after_checkpoint(self._wal_index.frames()[0])

    def sweep_wal(self, *, start: bool = True) -> bool:
        """The registry's periodic look at this object (see storage/wal.py): an object that has
        been quiet since the last look gets its WAL file emptied, or a small one's frames copied
        into the database, on the writer thread. Returns whether that is due; with `start`
        false the registry starts it later (`start_wal_trim`), a few objects at a time."""
        index = self._wal_index
        if self._closed or index is None or self._writing or self.damaged is not None:
            return False  # a write under way: not quiet; the next looks will tell
        kind = self._quiet_trim.due(self._commits, lambda: _wal_bytes(self.path), index.holds_uncopied_frames)
        if kind is None:
            return False
        self._trim_at, self._trim_kind = self._commits, kind
        if start:
            self.start_wal_trim()
        return True

    def start_wal_trim(self) -> None:
        """Runs the WAL trim the last look found due (`sweep_wal`), unless a write came since."""
        if self._trim_at is not None and not self._closed:
            self._start_writer(asyncio.get_running_loop())

    def _truncate_wal(self) -> None:
        """A TRUNCATE checkpoint that gives up at once rather than wait for a reader or for
        another connection's write lock (a replicator's)."""
        assert self._wal_index is not None
        if self.damaged is not None:  # found since the sweep asked for it
            return
        conn = self._writer
        try:
            self._writer_waits(False)
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as exc:
            self._failed(exc, "", "checkpoint")
            log.warning("object %r: WAL not emptied: %s", self.object_key, exc)
            return
        if not busy:
            self.wal_trims += 1
        self._checkpoints.after_checkpoint(self._wal_index.frames()[0])

    def _settle(self, batch: list[_Job], outcomes: list[tuple[bool, Any]], events: list[ChangeEvent]) -> None:
        if events:
            self.feed.publish(events)  # committed: publish before anyone is answered
        for job, (ok, value) in zip(batch, outcomes, strict=True):
            if ok and job.after is not None:
                try:
                    job.after(value)
                except Exception:  # bookkeeping: the write itself committed, and others wait
                    log.exception("object %r: bookkeeping after a commit failed", self.object_key)
            if job.future.done():
                continue
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)
        if self._memo_epoch & 1:
            self._memo_epoch += 1  # the batch's bookkeeping has run (answers wake their callers later)

    def _commit_batch(
        self, batch: list[_Job], *, begun: bool = False
    ) -> tuple[list[tuple[bool, Any]], list[ChangeEvent]]:
        started = time.perf_counter()
        try:
            return self._run_batch(batch, begun)
        finally:
            self._commit_seconds = recent_estimate(self._commit_seconds, time.perf_counter() - started)

    def _run_batch(self, batch: list[_Job], begun: bool) -> tuple[list[tuple[bool, Any]], list[ChangeEvent]]:
        conn = self._writer
        ctx = WriteContext(conn, self._tails)
        outcomes: list[tuple[bool, Any]] = []
        if self.damaged is not None:  # found by an earlier job (of this batch's rounds, or a read)
            if begun:
                self._roll_back()
            return [(False, self.damaged.again("write")) for _ in batch], []
        if not begun:
            try:
                self._writer_waits(True)
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                failure = self._failed(exc, f"could not start a write transaction: {exc}", "write")
                return [(False, failure) for _ in batch], []
        # A lone job needs no savepoint: if it fails, the whole transaction is its to roll back.
        alone = len(batch) == 1
        for index, job in enumerate(batch):
            before_tails = dict(ctx.pending_tails)
            before_writes = ctx.row_writes
            before_events = len(ctx.events)
            before_changes = dict(ctx.changed_sessions)  # values are immutable
            try:
                if alone:
                    value = job.run(ctx)
                else:
                    conn.execute("SAVEPOINT job")
                    value = job.run(ctx)
                    conn.execute("RELEASE job")
            except BaseException as exc:
                if is_damage(exc):
                    # The file is damaged: nothing of the batch commits (the jobs before this
                    # one ran over the same damaged pages), and nothing more is written to it.
                    return self._abandon(batch, "", exc), []
                refused: BaseException = (
                    self._failed(exc, f"storage failed: {exc}", "write") if isinstance(exc, sqlite3.Error) else exc
                )
                queries.forget_uncommitted(conn)
                if alone:
                    with contextlib.suppress(sqlite3.Error):
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                    return [(False, refused)], []
                if not self._undo_job(conn):
                    return self._run_without(batch, index, exc)
                ctx.pending_tails = before_tails
                ctx.row_writes = before_writes
                del ctx.events[before_events:]
                ctx.changed_sessions = before_changes
                outcomes.append((False, refused))
                continue
            outcomes.append((True, value))
        if not self._memo_epoch & 1:
            self._memo_epoch += 1  # readers may see this commit before its bookkeeping runs
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if alone or is_damage(exc):
                return self._abandon(batch, f"commit failed, nothing was written: {exc}", exc), []
            return self._commit_each_alone(batch, outcomes)
        with self._tails_lock:
            for session_id, tail in ctx.pending_tails.items():
                self._tails.pop(session_id, None)  # re-inserted last: the most recently written
                if tail is not _FORGET:
                    self._tails[session_id] = tail
            self._bound_tails()
            self._commits += 1
        if ctx.changed_sessions:
            self.feed.watches.note(ctx.changed_sessions)
        self.row_writes += ctx.row_writes
        if self._wal_index is not None:
            self._checkpoints.after_commit(self._wal_index.frames()[0])
        return outcomes, ctx.events

    def _run_without(
        self, batch: list[_Job], index: int, exc: BaseException
    ) -> tuple[list[tuple[bool, Any]], list[ChangeEvent]]:
        """After SQLite abandoned the whole transaction during `batch[index]` (the disk filled
        mid-statement, say): nothing of the batch is written. That job is refused; the others
        had no part in its failure and run again in a transaction of their own, as they would
        have without it. Each round refuses one job, so this ends."""
        self._forget_tails()
        refused = self._failed(exc, f"storage failed, nothing was written: {exc}", "write")
        outcomes, events = self._run_batch([*batch[:index], *batch[index + 1 :]], begun=False)
        outcomes.insert(index, (False, refused))
        return outcomes, events

    def _commit_each_alone(
        self, batch: list[_Job], outcomes: list[tuple[bool, Any]]
    ) -> tuple[list[tuple[bool, Any]], list[ChangeEvent]]:
        """After the batch's COMMIT failed: nothing of it is written. A full disk shows here, as
        SQLite writes a transaction's pages to the WAL when it commits, and which job's pages did
        not fit is unknown; so each job that had succeeded runs again with a commit of its own,
        as it would have without the others. Jobs already refused keep their answers."""
        with contextlib.suppress(sqlite3.Error):
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
        queries.forget_uncommitted(self._writer)
        self._forget_tails()
        answers: list[tuple[bool, Any]] = []
        events: list[ChangeEvent] = []
        for job, (ok, value) in zip(batch, outcomes, strict=True):
            if not ok:
                answers.append((ok, value))
                continue
            (answer,), job_events = self._run_batch([job], begun=False)
            answers.append(answer)
            events += job_events
        return answers, events

    @staticmethod
    def _undo_job(conn: sqlite3.Connection) -> bool:
        """Rolls one job back to its savepoint; False when the transaction itself is gone."""
        if not conn.in_transaction:
            return False
        try:
            conn.execute("ROLLBACK TO job")
            conn.execute("RELEASE job")
        except sqlite3.Error:
            return False
        return conn.in_transaction

    def _abandon(self, batch: list[_Job], reason: str, cause: BaseException) -> list[tuple[bool, Any]]:
        """Rolls the whole batch back and fails every job in it; caches forget what they saw.
        A damaged file (`is_damage`) fails each with ObjectDamaged, whatever `reason` says."""
        self._roll_back()
        failure = self._failed(cause, reason, "write")
        if isinstance(failure, ObjectDamaged):
            return [(False, failure.again("write")) for _ in batch]
        return [(False, StorageError(reason, cause=cause, operation="write")) for _ in batch]

    def _roll_back(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
        queries.forget_uncommitted(self._writer)
        self._forget_tails()

    def _failed(self, exc: BaseException, message: str, operation: str) -> StorageError:
        """The StorageError for SQLite's failure `exc` during `operation`; when it reports the
        file damaged, the store is marked so (`damaged`) and the registry told."""
        failure = damage_or_failure(exc, message, operation)
        if type(failure) is StorageError and not failure.permission_denied and permission_denied_on(self.path, exc):
            failure.permission_denied = True  # a file made read-only for the server's user, say
        if isinstance(failure, ObjectDamaged) and self.damaged is None:
            self.damaged = failure
            log.debug("object %r: file damaged (%s): %s", self.object_key, operation, failure)
            if self.on_damage is not None:
                self.on_damage(failure)
        return failure

    def _forget_tails(self) -> None:
        with self._tails_lock:
            self._tails.clear()
            self._commits += 1

    @property
    def commits(self) -> int:
        """How many commits this store has made (or failed to make) since it opened: the file
        stayed as it was while the count did not move. Counted once a commit has ended, before
        its callers are answered."""
        return self._commits

    @property
    def queued_writes(self) -> int:
        """Write jobs waiting for the writer (behind a commit under way)."""
        return len(self._queue)

    # ── reads ───────────────────────────────────────────────────────────────

    async def read(
        self,
        run: Callable[[sqlite3.Connection], T],
        *,
        quick: bool = False,
        kind: str = "point",
        deadline: float | None = None,
    ) -> T:
        """Runs `run` with a read connection on the executor. `quick`: the caller knows `run`
        to be short (point reads, a few dozen at most; a search of a small object), which may
        then run in place (see the module docstring); `run` must be safe to run twice, as a read
        is. Quick reads of one `kind` share the estimate that decides where the next one runs.
        `deadline` (time.monotonic): past it the read is stopped, wherever it runs, and raises
        QueryInterrupted."""
        if self._closed:
            raise StoreClosed("the object was closed while this call used it")
        if self.damaged is not None:
            raise self.damaged.again("read")
        if quick and self._may_read_here(kind):
            try:
                return self._read_here(run, kind, deadline)
            except _RunAgain:
                pass
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._read_blocking, run, kind if quick else None, deadline)

    def _may_read_here(self, kind: str) -> bool:
        return (
            self._calls_in_flight is not None
            and self._calls_in_flight() <= 1
            and self._quick_read_seconds.get(kind, 0.0) <= INLINE_MAX_SECONDS
            and not self._writing
            and not self._writer.in_transaction
        )

    def _read_here(self, run: Callable[[sqlite3.Connection], T], kind: str, deadline: float | None) -> T:
        # On the writer's connection: it is idle (nothing queued or committing, and in-place
        # commits finish before the loop moves on), so it reads the last committed state, and a
        # freshly opened object needs no second connection (opening one costs about 0.3 ms).
        conn = self._writer
        self._writer_waits(False)  # the event loop must not wait for a lock
        started = time.monotonic()
        stop_at = started + INLINE_MAX_SECONDS if deadline is None else min(started + INLINE_MAX_SECONDS, deadline)
        # A read that outlasts its time in place (huge messages, a cold disk) is stopped between
        # SQLite steps and runs again on the executor. The handler is the read's alone: commits
        # on this connection must never be interrupted.
        conn.set_progress_handler(functools.partial(_past, stop_at), PROGRESS_STEPS)
        self._begun_at[id(conn)] = self._commits
        try:
            conn.execute("BEGIN")  # one snapshot, as on the executor
            value = run(conn)
        except sqlite3.Error as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code == sqlite3.SQLITE_INTERRUPT:
                if deadline is not None and _past(deadline):
                    raise QueryInterrupted(str(exc)) from None
                # Known now to take longer than its time here: the next reads of its kind go
                # to the executor, whose timings bring them back once they are quick.
                self._quick_read_seconds[kind] = max(
                    self._quick_read_seconds.get(kind, 0.0), time.monotonic() - started
                )
                raise _RunAgain from exc
            if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise _RunAgain from exc
            raise self._failed(exc, f"storage read failed: {exc}", "read") from exc
        finally:
            del self._begun_at[id(conn)]
            conn.set_progress_handler(None, 0)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        self._note_quick_read(kind, started)
        self.inline_reads += 1
        return value

    def _note_quick_read(self, kind: str, started: float) -> None:
        estimate = self._quick_read_seconds.get(kind, 0.0)
        self._quick_read_seconds[kind] = recent_estimate(estimate, time.monotonic() - started)

    def _read_blocking(
        self, run: Callable[[sqlite3.Connection], T], quick_kind: str | None = None, deadline: float | None = None
    ) -> T:
        with self._readers_lock:
            conn = self._readers.pop() if self._readers else None
        if conn is None:
            try:
                conn = _connect(self.path)
            except sqlite3.Error as exc:
                if fdlimit.is_out_of_descriptors(exc, self.path):
                    raise OutOfDescriptors(
                        "the server has as many files open as it may: no connection for this read; retry shortly"
                    ) from exc
                raise self._failed(exc, f"storage read failed: {exc}", "read") from exc
            conn.execute("PRAGMA query_only = 1")
        started = time.monotonic()
        if deadline is not None:
            conn.set_progress_handler(functools.partial(_past, deadline), DEADLINE_PROGRESS_STEPS)
        self._begun_at[id(conn)] = self._commits
        try:
            # One snapshot for the whole read: its statements (a message's row, then its
            # continuation rows) must not straddle a commit, or a large message comes back torn.
            conn.execute("BEGIN")
            return run(conn)
        except sqlite3.Error as exc:
            if deadline is not None and getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_INTERRUPT:
                raise QueryInterrupted(str(exc)) from None
            raise self._failed(exc, f"storage read failed: {exc}", "read") from exc
        finally:
            del self._begun_at[id(conn)]
            if deadline is not None:
                conn.set_progress_handler(None, 0)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if quick_kind is not None:  # so that a slow object's quick reads, on either path, keep to the executor
                self._note_quick_read(quick_kind, started)
            with self._readers_lock:
                if len(self._readers) < MAX_IDLE_READERS and not self._closed:
                    self._readers.append(conn)
                    conn = None
            if conn is not None:
                if self.damaged is not None:
                    self._close_leaving_file([conn])
                else:
                    conn.close()

    @property
    def memo_epoch(self) -> int:
        """Moves at each COMMIT and again once that commit's `after` bookkeeping has run: odd
        while a committed write may be visible to readers but not yet in what the domain
        remembers of the object (`memo`). What a read takes from the memo agrees with its
        snapshot when the epoch was even before the snapshot began (before the read's first
        statement: SQLite takes the snapshot there) and is the same after the memo was
        consulted: no commit was waiting for its bookkeeping then, nor began since."""
        return self._memo_epoch

    def read_on_executor(self, conn: sqlite3.Connection) -> None:
        """Called by a quick read that finds more to do than a read in place should (large
        messages to put together: Python work no stop interrupts): run in place (on the
        writer's connection), it stops here and runs again on the executor."""
        if conn is self._writer:
            raise _RunAgain

    def latest_leaf_id(self, conn: sqlite3.Connection, session_id: str) -> str | None:
        """The active leaf as the reader's snapshot has it: its max-seq row, one seek of the seq
        index. (The writer's cached tail, taken before the snapshot and checked only for the
        leaf's presence in it, could be a leaf newer rows had replaced, paired with their later
        texts: a state that never existed.) Caches the tail for writers when nothing committed
        since the read began (before its snapshot: a tail read from a snapshot older than a
        commit counted since, cached, gave appends a parent and seq that were no longer the
        session's newest)."""
        begun = self._begun_at.get(id(conn))
        with self._tails_lock:
            commits = self._commits if begun is None else begun
        tail = _tail_in(conn, session_id)
        with self._tails_lock:
            if self._commits == commits:  # nothing committed meanwhile: the view is current
                self._tails[session_id] = tail
                self._bound_tails()
        return tail.leaf_id

    def _bound_tails(self) -> None:
        """Keeps the tails of the MAX_CACHED_TAILS sessions written last (call with the lock held):
        an object open for long with ever new sessions must not keep one for each; a session
        without one reads its newest row again at its next write."""
        tails = self._tails
        while len(tails) > MAX_CACHED_TAILS:
            del tails[next(iter(tails))]

    def search_index_committed(self) -> None:
        """The search index now exists for good: writes stop looking it up."""
        queries.remember_fts(self._writer)

    def cached_file_bytes(self, max_age_seconds: float = 1.0) -> int:
        """`file_bytes`, re-measured at most once per `max_age_seconds` (for the write path),
        plus what writes queued since said they add (a burst of writes between two
        measurements would otherwise pass the size limit many times over)."""
        measured_at, size = self._size_cache
        now = time.monotonic()
        if now - measured_at > max_age_seconds:
            size = self.file_bytes()
            self._size_cache = (now, size)
            self._grown_since_measured = 0
        return size + self._grown_since_measured

    async def cached_bytes_in_use(self) -> int:
        """The database's pages that hold data (`queries.bytes_in_use`), read again once a commit
        was made since, plus what writes queued since said they add, as `cached_file_bytes`.
        For a file past a size limit: what deletes freed in it is room again."""
        commits, size, grown_then = self._in_use_cache
        if commits != self._commits:
            commits, grown_then = self._commits, self._grown
            size = await self.read(queries.bytes_in_use, quick=True)
            self._in_use_cache = (commits, size, grown_then)
        return size + self._grown - grown_then

    def file_bytes(self) -> int:
        """Bytes of the object's database file and its WAL."""
        total = _wal_bytes(self.path)
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(self.path).st_size
        return total

    def database_bytes(self) -> int:
        """The object's data as of its last commit (its pages, in the file or still in the WAL),
        without the WAL's older page versions that `file_bytes` counts: what a read of all of it
        would meet. The file's size where the wal-index is not open or not yet written."""
        size = None if self._wal_index is None else self._wal_index.database_bytes()
        if size:
            return size
        with contextlib.suppress(FileNotFoundError):
            return self.path.stat().st_size
        return 0

    # ── lifecycle ───────────────────────────────────────────────────────────

    @property
    def row_writes_since_open(self) -> int:
        """Rows this store wrote (as upstream bills them) since the object was opened."""
        return self.row_writes - self._row_writes_saved

    @property
    def busy(self) -> bool:
        return self.users > 0 or self._writing

    @property
    def _writing(self) -> bool:
        """Jobs are queued or committing on the writer thread, or a checkpoint is running."""
        return bool(self._queue) or (self._writer_task is not None and not self._writer_task.done())

    async def settled(self) -> None:
        """Returns once no write is queued or committing and no checkpoint is running."""
        while self._writer_task is not None and not self._writer_task.done():
            await asyncio.shield(self._writer_task)

    async def close(self) -> None:
        """Waits for queued writes, then closes every connection (checkpointing the WAL). Any
        number of callers may close a store: one close runs and each waits for it (two at once
        would close the same descriptors twice, by then perhaps another file's)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close_once())
        await asyncio.shield(self._closing)

    def on_close(self, hook: Callable[[], None]) -> None:
        """Runs `hook` (on the event loop's thread, or at once if closed already) when the store
        closes: to drop what is kept in memory for it elsewhere."""
        if self._closed:
            hook()
        else:
            self._close_hooks.append(hook)

    async def _close_once(self) -> None:
        await self.settled()
        self._closed = True
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # bookkeeping: the close goes on
                log.exception("object %r: a close hook failed", self.object_key)
        wal_bytes = _wal_bytes(self.path)
        if self._closes_in_place(wal_bytes):
            self.inline_closes += 1
            self._close_blocking(wal_bytes)
        else:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close_blocking, wal_bytes)

    def _closes_in_place(self, wal_bytes: int) -> bool:
        """Whether the close runs on the calling thread: the server is quiet and the close
        writes nothing (no checkpoint, no row count to save), only releases the connections."""
        return (
            self._calls_in_flight is not None
            and self._calls_in_flight() <= 1
            and wal_bytes == 0
            and self.row_writes == self._row_writes_saved
        )

    def _close_blocking(self, wal_bytes: int) -> None:
        with self._readers_lock:
            readers, self._readers = self._readers, []
        if self.damaged is not None:  # nothing more is written to a damaged file
            try:
                self._close_leaving_file([*readers, self._writer])
            finally:
                if self._wal_index is not None:
                    self._wal_index.close()
            return
        for conn in readers:
            conn.close()
        if self.row_writes != self._row_writes_saved:
            with contextlib.suppress(sqlite3.Error):
                schema.write_row_writes(self._writer, self.row_writes)
            wal_bytes = _wal_bytes(self.path)
        if wal_bytes > 0:
            with contextlib.suppress(sqlite3.Error):
                # Never wait for readers here: a replicator (Litestream) always holds a read
                # transaction; then the WAL is left to it instead of stalling the close.
                self._writer.execute("PRAGMA busy_timeout = 0")
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._writer.close()
        if self._wal_index is not None:
            self._wal_index.close()

    def _close_leaving_file(self, connections: list[sqlite3.Connection]) -> None:
        """Closes connections of a damaged object without the checkpoint SQLite runs as the last
        connection to a file in WAL mode closes, which would write the WAL's frames into the
        damaged file and remove the WAL before an operator could copy either: at the store's
        close, and for a read still running then, whose connection closes after. A read-only
        connection holding the file's shared lock meanwhile keeps the others from the exclusive
        lock that checkpoint takes, and closes last, as one that may not write. If it cannot
        read the file (no database at all), there is nothing a checkpoint could copy into."""
        holder: sqlite3.Connection | None = None
        try:
            holder = files.open_read_only(self.path)
            holder.execute("PRAGMA schema_version").fetchone()  # takes the lock it keeps while open
        except sqlite3.Error:
            pass
        try:
            for conn in connections:
                conn.close()
        finally:
            if holder is not None:
                holder.close()


def _wal_bytes(database: Path) -> int:
    """Bytes in the database's WAL file; 0 when it has none. `os.stat` of the name, not a `Path`
    made of it: several run on the event loop for each new object, and the `Path` cost 6 µs more
    than the `stat` (5 µs)."""
    try:
        return os.stat(f"{database}-wal").st_size
    except FileNotFoundError:
        return 0


def _connect_writer(path: Path, busy_timeout_ms: int) -> queries.ObjectConnection:
    # Not `_connect`: a new file must get its page size before WAL mode creates it.
    return sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout_ms / 1000,
        factory=queries.ObjectConnection,
    )


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        timeout=schema.BUSY_TIMEOUT_MS / 1000,
        factory=queries.ObjectConnection,
    )
    schema.configure_connection(conn, writes=False)
    return conn


# ── write jobs: message rows ─────────────────────────────────────────────────


def append_in(
    ctx: WriteContext,
    session_id: str,
    row: NewRow,
    parent: Parent,
    stored_row_ok: Callable[[StoredMessage], bool],
) -> AppendOutcome:
    conn = ctx.conn
    tail = ctx.tail(session_id)
    parent_id: str | None
    if parent.kind == "auto":
        parent_id = tail.leaf_id
    elif parent.kind == "root":
        parent_id = None
    else:
        wanted = parent.message_id
        parent_id = wanted if wanted and queries.exists(conn, session_id, wanted) else None
    created = now_ms()
    written = queries.insert_message(
        conn, session_id, row, seq=tail.next_seq, parent_id=parent_id, created_at_ms=created
    )
    if written is None:
        _store_missing_payloads(ctx, session_id, row)
        existing = queries.get_message(conn, session_id, row.id)
        if existing is not None and stored_row_ok(existing):
            return AppendOutcome(False, existing.info, existing)
        raise StoredRowUnreadable(f"message id {row.id!r} is taken by a stored row that is not a valid message")
    ctx.row_writes += written
    ctx.set_tail(session_id, Tail(row.id, tail.next_seq + 1))
    info = RowInfo(row.id, row.role, parent_id, tail.next_seq, created, row.token_estimate)
    return AppendOutcome(True, info, None)


def append_chain_in(ctx: WriteContext, session_id: str, rows: Sequence[NewRow]) -> list[AppendOutcome] | None:
    """Appends rows one after another under the session's tail (each an `auto` parent) in one
    statement, when each row is plain (queries.plain_row) and every id is fresh; None, having
    written nothing, when not: then `append_in` row by row finds which are present. A batch
    of fresh messages, the common case, so costs one statement instead of one per row."""
    infos = _insert_chain(ctx, session_id, rows, None, [now_ms()] * len(rows))
    return None if infos is None else [AppendOutcome(True, info, None) for info in infos]


def _insert_chain(
    ctx: WriteContext,
    session_id: str,
    rows: Sequence[NewRow],
    parents: Sequence[str | None] | None,
    created_at_ms: Sequence[int],
) -> list[RowInfo] | None:
    """Inserts rows in order, each taking the next seq and becoming the tail, in one statement;
    `parents` None: each under the one before, the first under the tail. None, having written
    nothing, unless each row is plain (queries.plain_row) and every id is fresh."""
    if not rows or not all(queries.plain_row(row) for row in rows):
        return None
    tail = ctx.tail(session_id)
    if parents is None:
        parents = [tail.leaf_id, *(row.id for row in rows[:-1])]
    seq = tail.next_seq
    written = queries.insert_plain_chain(ctx.conn, session_id, rows, parents, seq, created_at_ms)
    if written is None:
        return None
    ctx.row_writes += written
    ctx.set_tail(session_id, Tail(rows[-1].id, seq + len(rows)))
    return [
        RowInfo(row.id, row.role, parent_id, seq + index, created, row.token_estimate)
        for index, (row, parent_id, created) in enumerate(zip(rows, parents, created_at_ms, strict=True))
    ]


def update_in(ctx: WriteContext, session_id: str, row: NewRow) -> UpdateOutcome:
    """Replaces a row's content unless unchanged (digest, or content for unstamped rows). An
    unchanged row still gains the payloads it names that the object lacks (its pointers were
    written before their bytes, copied from another object): sent inline, they are stored."""
    conn = ctx.conn
    key = queries.update_key_columns(conn, session_id, row.id)
    if key is None:
        return UpdateOutcome("missing", None)
    old_chunks, old_digest = key
    if old_digest is not None:
        if old_digest == row.digest:
            _store_missing_payloads(ctx, session_id, row)
            return UpdateOutcome("unchanged", queries.row_info(conn, session_id, row.id))
    else:
        stored = queries.get_message(conn, session_id, row.id)
        if stored is not None and stored.content == "".join(row.slices):
            _store_missing_payloads(ctx, session_id, row)
            queries.stamp_digest(conn, session_id, row.id, row.digest)
            ctx.row_writes += 1
            return UpdateOutcome("unchanged", stored.info)
    ctx.row_writes += queries.rewrite_message(conn, session_id, row, old_chunks)
    return UpdateOutcome("updated", queries.row_info(conn, session_id, row.id))


def _store_missing_payloads(ctx: WriteContext, session_id: str, row: NewRow) -> None:
    """Of a row not written (its id taken, or unchanged): the payloads it brings that stored
    messages name and the object lacks (their pointers written before their bytes)."""
    if row.payloads:
        ctx.row_writes += queries.put_payloads(ctx.conn, session_id, row, named_only=True)


def import_all_in(
    ctx: WriteContext,
    session_id: str,
    rows: Sequence[NewRow],
    parents: Sequence[str | None],
    created_at_ms: Sequence[int],
) -> list[RowInfo | None]:
    """`import_in` for each row in order: in one statement when each is plain and every id is
    fresh (an import into an empty session, the common case), else row by row."""
    infos = _insert_chain(ctx, session_id, rows, parents, created_at_ms)
    if infos is not None:
        return list(infos)
    return [
        import_in(ctx, session_id, row, parent_id, created)
        for row, parent_id, created in zip(rows, parents, created_at_ms, strict=True)
    ]


def import_in(
    ctx: WriteContext, session_id: str, row: NewRow, parent_id: str | None, created_at_ms: int
) -> RowInfo | None:
    """Imports one row verbatim unless its id exists (None); the imported row becomes the tail.
    An existing id stores only payloads stored messages name and the object lacks, none that
    nobody names (upstream leaves those as orphans; §9)."""
    tail = ctx.tail(session_id)
    written = queries.insert_message(
        ctx.conn, session_id, row, seq=tail.next_seq, parent_id=parent_id, created_at_ms=created_at_ms
    )
    if written is None:
        _store_missing_payloads(ctx, session_id, row)
        return None
    ctx.row_writes += written
    ctx.set_tail(session_id, Tail(row.id, tail.next_seq + 1))
    return RowInfo(row.id, row.role, parent_id, tail.next_seq, created_at_ms, row.token_estimate)


def delete_in(ctx: WriteContext, session_id: str, ids: list[str]) -> int:
    deleted, written = queries.delete_messages(ctx.conn, session_id, ids)
    ctx.row_writes += written
    ctx.forget_tail(session_id)
    return deleted


def clear_in(ctx: WriteContext, session_id: str) -> int:
    deleted, written = queries.clear_session(ctx.conn, session_id)
    ctx.row_writes += written
    ctx.set_tail(session_id, Tail(None, 1))
    return deleted
