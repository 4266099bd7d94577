"""The set of open objects: opened on demand, kept in an LRU, closed (hibernated) when idle.

Like Durable Objects, an object is opened by its first request and closed when it falls out of
the bounded LRU while idle; the next request reopens it. The bound keeps file descriptors and
memory flat however many objects exist on disk.

An object's change feed (its hub: revisions, retained events, subscribers) lives here, not in its
store: a subscription holds the hub alone, so subscribers keep no file open (an object is
evicted under them and reopened by the next write, its revisions going on), and subscribing to
an object never written creates nothing. A hub goes when its object is closed and nobody
subscribes.

A damaged object is quarantined here, by key: once SQLite reports its file corrupt or not a
database (on open, a read or a write), or the file proves to be another program's database,
every later call on the key is refused with ObjectDamaged before anything opens or touches the
file, also after its store closed (it is closed as soon as its calls are done). The key stays
refused until the file is erased or replaced (`forget_damage`, called by DeleteObject and
ImportObject once they are done) or is gone from the disk; a restart forgets it, and the next
call to meet the damage quarantines the object again. The set holds one entry per damaged file
on disk, so it grows no faster than damaged files do, and shrinks as they are dealt with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, cast

from sessions_server.storage import fdlimit, files, wal
from sessions_server.storage.datadir import SCRATCH_DIR_NAME
from sessions_server.storage.feed import FeedClosed, FeedHub, Feeds, FeedSettings
from sessions_server.storage.paths import object_file_name, object_path
from sessions_server.storage.rows import (
    ObjectDamaged,
    OutOfDescriptors,
    StorageError,
    damage_from,
    is_damage,
    permission_denied_on,
)
from sessions_server.storage.store import ObjectStore, recent_estimate
from sessions_server.storage.watches import ChangeWatch, ChangeWatches

log = logging.getLogger("sessions.storage")

DEFAULT_MAX_OPEN_OBJECTS = 256
# A ready file opens on the calling thread only while this registry's opens of ready files have
# lately taken at most this long (a cold or slow disk keeps them on the executor).
INLINE_OPEN_MAX_SECONDS = 0.005
DESCRIPTORS_LOG_SECONDS = 60.0  # at most one warning this often while opens find no descriptor

CLOSE_GRACE_SECONDS = 5.0
"""How long closing an object to replace or remove it waits for the calls using it to end."""
WAL_TRIMS_AT_ONCE = 2  # quiet objects' WAL checkpoints a sweep runs at once (`sweep_wals`)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Marks a task's failure seen: whoever waited for it has it; nobody may have."""
    if not task.cancelled():
        task.exception()


class ObjectRegistry:
    """Opens, caches and closes ObjectStores. Use `async with registry.use(key) as store:`."""

    def __init__(
        self,
        data_dir: Path,
        executor: Executor,
        *,
        max_open: int = DEFAULT_MAX_OPEN_OBJECTS,
        feed: FeedSettings | None = None,
        calls_in_flight: Callable[[], int] | None = None,
        commit_executor: Executor | None = None,
        wal_sweep_seconds: float = wal.TRIM_SWEEP_SECONDS,
        discard_unwritten: bool = False,
    ) -> None:
        """`calls_in_flight` counts the requests the server is handling; with it, the registry
        may open a ready file, and a store may commit a small write or run a quick read, without
        a thread hop when its caller is alone (`_open_store`, `ObjectStore.write`,
        `ObjectStore.read`). Every `wal_sweep_seconds` (0: never) quiet objects' WAL files are
        emptied (storage/wal.py). `discard_unwritten`: a file an open made goes again when its
        last use ends with nothing committed to it (`_discard_unwritten`)."""
        self.data_dir = data_dir
        self.feeds = Feeds(feed)
        self._calls_in_flight = calls_in_flight
        self._executor = executor
        self._commit_executor = commit_executor
        self._max_open = _open_objects_that_fit(max(1, max_open))
        self._open: OrderedDict[str, ObjectStore] = OrderedDict()
        # Rows written since this registry began (sessions_row_writes_total): the closed stores'
        # counted as each close ends, the others' read with the count; the metrics' thread reads it.
        self._rows_lock = threading.Lock()
        self._rows_of_closed = 0
        self._unclosed: set[ObjectStore] = set()
        self._opening: dict[str, asyncio.Future[ObjectStore]] = {}  # opens under way, each a task
        self._closing: dict[str, ObjectStore] = {}  # evicted, their close under way
        self._closes: set[asyncio.Task[None]] = set()
        self._feeds_closed: FeedClosed | None = None  # set by a drain
        self._hubs: dict[str, FeedHub] = {}  # of open objects, and of closed ones with subscribers
        # Of keys a compaction watches: kept through closes and hubs (each hub of the key gets them).
        self._watches: dict[str, ChangeWatches] = {}
        self._held: dict[str, asyncio.Event] = {}
        # Keys whose files are damaged or foreign, with what was found (see the module docstring).
        self._damaged: dict[str, ObjectDamaged] = {}
        self._open_seconds = 0.0  # running estimate of one open of a ready file
        self._descriptors_logged_at = -DESCRIPTORS_LOG_SECONDS
        self.inline_opens = 0  # objects opened on the calling thread
        self._wal_sweep_seconds = wal_sweep_seconds
        self._wal_sweep: asyncio.TimerHandle | None = None  # armed by the first open
        self._wal_trims: list[asyncio.Future[None]] = []  # sweeps' trims still running (`_trim_in_turns`)
        self._swept = False  # close_all ran: no more sweeps
        self._discard_unwritten_files = discard_unwritten

    @property
    def open_count(self) -> int:
        return len(self._open)

    def use(
        self, object_key: str, check: Callable[[], None] | None = None
    ) -> contextlib.AbstractAsyncContextManager[ObjectStore]:
        """The open object, opened on demand, for an `async with` block. `check` runs again
        after every wait (for a `closed` block, another call's open or an eviction's close) and
        raises to give up: the object may have been removed meanwhile, and an open would create
        it anew."""
        # Never None: `create` makes the file.
        return cast("contextlib.AbstractAsyncContextManager[ObjectStore]", _InUse(self, object_key, check, create=True))

    def use_existing(
        self, object_key: str, check: Callable[[], None] | None = None
    ) -> contextlib.AbstractAsyncContextManager[ObjectStore | None]:
        """As `use`, but None when the object has no file here: what only reads needs no file,
        and opening one would create it (a read-only caller could fill the disk with empty
        objects)."""
        return _InUse(self, object_key, check, create=False)

    def _release(self, store: ObjectStore) -> asyncio.Task[None] | None:
        """Ends a use of `store`; the removal of its file when that was the last use of an
        object this open made and nothing committed to (`_discard_unwritten`), if begun."""
        store.users -= 1
        discard = None
        if store.users == 0:
            store.idle.set()
            if store.damaged is not None:  # refused from now on: its files need not stay open
                self._evict_damaged(store)
            elif store.created and not store.commits and self._discard_unwritten_files:
                discard = self._discard_unwritten(store)
        self._evict_idle()
        return discard

    def _discard_unwritten(self, store: ObjectStore) -> asyncio.Task[None] | None:
        """Closes and removes an object whose file its store's open made, now that its last
        user left with nothing committed: the writes that made it were refused as they ran (a
        batch's results too large for its response, a message reading back past its cap), and
        an object exists once written. Requests for the key wait meanwhile (`_held`), as for a
        `closed` block; its subscribers stay (their feed carried nothing)."""
        key = store.object_key
        if self._open.get(key) is not store or store.busy or key in self._held:
            return None
        del self._open[key]
        gate = self._held[key] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._remove_unwritten(key, store, gate))
        self._closes.add(task)
        task.add_done_callback(self._closes.discard)
        return task

    async def _remove_unwritten(self, object_key: str, store: ObjectStore, gate: asyncio.Event) -> None:
        try:
            await self._close(store)
            if not store.commits:  # a close commits nothing of a file never written
                remove = functools.partial(
                    files.remove_object_files, store.path, self.data_dir / SCRATCH_DIR_NAME, prune=True
                )
                await asyncio.get_running_loop().run_in_executor(self._executor, remove)
        except Exception:  # the empty object stays, as before any write: listed, harmless
            log.warning(
                "object %r: the empty file of a refused first write could not be removed", object_key, exc_info=True
            )
        finally:
            del self._held[object_key]
            gate.set()
            self._drop_hub_if_unused(object_key)

    def _evict_damaged(self, store: ObjectStore) -> None:
        key = store.object_key
        if self._open.get(key) is store and not store.busy and key not in self._held:
            del self._open[key]
            self._closing[key] = store
            task = asyncio.get_running_loop().create_task(self._close_evicted(key, store))
            self._closes.add(task)
            task.add_done_callback(self._closes.discard)

    # ── damaged objects ─────────────────────────────────────────────────────

    def quarantine(self, object_key: str, damage: ObjectDamaged) -> None:
        """Refuses the object from now on (see the module docstring). Safe on any thread: one
        dict assignment."""
        damage.judged = True
        self._damaged.setdefault(object_key, damage)

    def _quarantine_from(self, object_key: str, store: ObjectStore, damage: ObjectDamaged) -> None:
        """A store's `on_damage`: quarantines its key while the store is still the key's (a
        store closed for an erase or a replacement may finish a read of the old file)."""
        if self._open.get(object_key) is store or self._closing.get(object_key) is store:
            self.quarantine(object_key, damage)
        damage.judged = True  # of a file erased or replaced since: not the key's now

    def forget_damage(self, object_key: str) -> None:
        """The object's file was erased or replaced: calls on the key open it again."""
        self._damaged.pop(object_key, None)

    def damage(self, object_key: str) -> ObjectDamaged | None:
        """What was found wrong with the object's file, if it is quarantined."""
        return self._damaged.get(object_key)

    def refuse_if_damaged(self, object_key: str, operation: str) -> None:
        """Raises ObjectDamaged (for `operation`) when the object is quarantined; a file
        removed by hand meanwhile lifts the quarantine (the key starts afresh)."""
        damage = self._damaged.get(object_key)
        if damage is None:
            return
        if object_path(self.data_dir, object_key).exists():
            raise damage.again(operation)
        del self._damaged[object_key]

    async def _acquire(self, object_key: str, check: Callable[[], None] | None, *, create: bool) -> ObjectStore | None:
        first_pass = True
        while True:
            if not first_pass and check is not None:  # every later pass follows a wait
                check()
            first_pass = False
            held = self._held.get(object_key)
            if held is not None:
                await held.wait()
                continue
            self.refuse_if_damaged(object_key, "open")
            store = self._open.get(object_key)
            if store is not None:
                self._open.move_to_end(object_key)
                store.users += 1
                store.idle.clear()
                return store
            pending = self._opening.get(object_key)
            if pending is not None:
                with contextlib.suppress(Exception):  # a failed open: this call tries its own
                    await asyncio.shield(pending)
                continue
            evicted = self._closing.get(object_key)
            if evicted is not None:  # its last writes to the file (a counter) come first
                await self._await_evicted(object_key, evicted)
                continue
            if not create and not object_path(self.data_dir, object_key).exists():
                return None  # one stat, in place: cheaper than the thread hop of an open
            # The open is a task of its own: a caller cancelled while it runs (a deadline) must
            # not cancel it under the calls waiting for it (they were told CancelledError, and
            # gRPC answered them nothing), nor leave a file opened on the executor unregistered.
            opening = asyncio.ensure_future(self._open_and_register(object_key))
            self._opening[object_key] = opening
            opening.add_done_callback(_retrieve)
            try:
                return await asyncio.shield(opening)  # its failure is this call's
            except asyncio.CancelledError:
                opening.add_done_callback(self._release_opened)  # the use it was opened for
                raise

    async def _open_and_register(self, object_key: str) -> ObjectStore:
        """Opens the object and registers it, in use by the call that started the open (which
        releases it, or has it released if it was cancelled meanwhile)."""
        try:
            store = await self._open_store(object_key)
        except BaseException:
            del self._opening[object_key]
            self._drop_hub_if_unused(object_key)
            raise
        del self._opening[object_key]
        self._open[object_key] = store
        with self._rows_lock:
            self._unclosed.add(store)
        store.on_damage = functools.partial(self._quarantine_from, object_key, store)
        store.users += 1
        store.idle.clear()
        if self._wal_sweep is None:
            self._arm_wal_sweep()
        return store

    def _arm_wal_sweep(self) -> None:
        if self._wal_sweep is not None:
            self._wal_sweep.cancel()  # a sweep called between two of the timer's
        if self._wal_sweep_seconds > 0 and not self._swept:
            self._wal_sweep = asyncio.get_running_loop().call_later(self._wal_sweep_seconds, self.sweep_wals)

    def sweep_wals(self) -> None:
        """Has each open object look whether its WAL file is due to be emptied or copied into
        its file (the timer calls this; tests call it too); the trims due then run
        WAL_TRIMS_AT_ONCE at a time. Each holds a commit thread while its checkpoint syncs: all
        at once, they held every one, and an append to a busy object waited 37-66 ms behind the
        checkpoints of 256 quiet objects."""
        try:
            due: list[ObjectStore] = []
            for store in self._snapshot():
                try:
                    if store.sweep_wal(start=False):
                        due.append(store)
                except Exception:  # one object's trouble (its WAL unreadable) spares the others'
                    log.exception("object %r: WAL sweep failed", store.object_key)
            if due:
                self._wal_trims.append(asyncio.ensure_future(self._trim_in_turns(due)))
                self._wal_trims = [task for task in self._wal_trims if not task.done()]
        finally:
            self._arm_wal_sweep()

    async def _trim_in_turns(self, due: list[ObjectStore]) -> None:
        turns = asyncio.Semaphore(WAL_TRIMS_AT_ONCE)

        async def trim(store: ObjectStore) -> None:
            async with turns:
                store.start_wal_trim()
                await store.settled()

        await asyncio.gather(*(trim(store) for store in due), return_exceptions=True)

    def _release_opened(self, opening: asyncio.Future[ObjectStore]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self._release(opening.result())

    async def _open_store(self, object_key: str) -> ObjectStore:
        """Opens the object's file (`_open_file`). When the process is out of file descriptors,
        closes half of the idle objects and raises OutOfDescriptors: below `max_open` nothing
        else would ever close them, and every later open would fail too."""
        path = object_path(self.data_dir, object_key)
        try:
            return await self._open_file(object_key)
        except ObjectDamaged as exc:  # another program's database (`schema.initialize`)
            self.quarantine(object_key, exc)
            raise
        except (OSError, sqlite3.Error) as exc:
            if is_damage(exc):
                damage = damage_from(exc, "open")
                self.quarantine(object_key, damage)
                raise damage from exc
            if permission_denied_on(path, exc):
                raise StorageError(
                    f"could not open the object's file for lack of permission: {exc}",
                    cause=exc,
                    operation="open",
                    permission_denied=True,
                ) from exc
            if not fdlimit.is_out_of_descriptors(exc, path):
                # A storage failure as any write's (a full disk when the file is made, say), not
                # an error of the server's own.
                raise StorageError(f"could not open the object's file: {exc}", cause=exc, operation="open") from exc
            opened = len(self._open)
            self._evict_idle(down_to=opened // 2)
            self._log_out_of_descriptors(opened)
            # The caller may be one tenant of many: how busy the server is goes to the log only.
            raise OutOfDescriptors(
                "the server has as many files open as it may: it is closing idle ones; retry shortly"
            ) from exc

    def _log_out_of_descriptors(self, opened: int) -> None:
        """Tells the operator, at most once a minute, that opens are being refused for want of
        file descriptors, with what would end it."""
        now = time.monotonic()
        if now - self._descriptors_logged_at < DESCRIPTORS_LOG_SECONDS:
            return
        self._descriptors_logged_at = now
        log.warning(
            "an object's open found no file descriptor left (RLIMIT_NOFILE %s) with %d objects open, "
            "%d files each at most: opens are refused while idle ones close; raise the limit "
            "(ulimit -n, LimitNOFILE) or lower --max-open-objects",
            fdlimit.soft_limit(),
            opened,
            fdlimit.FDS_PER_OBJECT,
        )

    async def _open_file(self, object_key: str) -> ObjectStore:
        """Opens the object's file: in place when the server is quiet, the file is ready and
        this registry's opens of ready files have been quick (see `storage.store`); anything
        else, and a file that needs creating or upgrading, on the executor."""
        path = object_path(self.data_dir, object_key)
        checked = False
        if (
            self._calls_in_flight is not None
            and self._calls_in_flight() <= 1
            and self._open_seconds <= INLINE_OPEN_MAX_SECONDS
        ):
            store = self._open_ready(object_key, path, self._hub(object_key))
            if store is not None:
                self.inline_opens += 1
                return store
            checked = True
        loop = asyncio.get_running_loop()
        hub = self._hub(object_key)
        return await loop.run_in_executor(self._executor, self._open_blocking, object_key, path, hub, checked)

    def _open_ready(self, object_key: str, path: Path, hub: FeedHub) -> ObjectStore | None:
        """`ObjectStore.open_ready`, timed on either thread, so that once opens are quick again
        they run in place again."""
        started = time.perf_counter()
        store = ObjectStore.open_ready(
            object_key, path, self._executor, hub, self._calls_in_flight, commit_executor=self._commit_executor
        )
        if store is not None:
            self._open_seconds = recent_estimate(self._open_seconds, time.perf_counter() - started)
        return store

    def _open_blocking(self, object_key: str, path: Path, hub: FeedHub, ready_checked: bool) -> ObjectStore:
        store = None if ready_checked else self._open_ready(object_key, path, hub)
        if store is None:
            store = ObjectStore.open(
                object_key,
                path,
                self._executor,
                hub,
                self._calls_in_flight,
                commit_executor=self._commit_executor,
                staging=self.data_dir / SCRATCH_DIR_NAME,
            )
        return store

    # ── feeds ───────────────────────────────────────────────────────────────

    def _hub(self, object_key: str) -> FeedHub:
        hub = self._hubs.get(object_key)
        if hub is None:
            hub = self._hubs[object_key] = self.feeds.hub(object_key)  # above every feed's revisions before it
            watches = self._watches.get(object_key)
            if watches is not None:  # the object's watches go on, whichever store commits
                hub.watches = watches
            if self._feeds_closed is not None:
                hub.close_all(self._feeds_closed)
        return hub

    def _drop_hub_if_unused(self, object_key: str) -> None:
        """Forgets the hub of an object that is not open and has no subscriber (its retained
        events with it: a resume from before gets a reset, as after a restart)."""
        hub = self._hubs.get(object_key)
        if (
            hub is not None
            and not hub.subscriber_count
            and object_key not in self._open
            and object_key not in self._opening
            and object_key not in self._closing
        ):
            del self._hubs[object_key]
            self._let_go(object_key, hub, FeedClosed("the object closed"))

    def _let_go(self, object_key: str, hub: FeedHub, why: FeedClosed) -> None:
        hub.close_all(why)

    @contextlib.asynccontextmanager
    async def feed(self, object_key: str, check: Callable[[], None] | None = None) -> AsyncIterator[FeedHub]:
        """The object's feed hub, without opening the object. `check` as for `use`."""
        while (held := self._held.get(object_key)) is not None:
            await held.wait()
            if check is not None:
                check()
        hub = self._hub(object_key)
        try:
            yield hub
        finally:
            self._drop_hub_if_unused(object_key)

    @contextlib.contextmanager
    def watch(self, object_key: str, session_id: str) -> Iterator[ChangeWatch]:
        """Watches the session's changes other than appends (`storage.watches`) for the block,
        without opening the object. The watch lasts through closes to make room, and sees
        everything changed when the object's file is replaced or removed, then what the new
        file's commits change."""
        watch = self.start_watch(object_key, session_id)
        try:
            yield watch
        finally:
            self.stop_watch(object_key, watch)

    def start_watch(self, object_key: str, session_id: str) -> ChangeWatch:
        """`watch` for as long as the caller holds it: end it with `stop_watch`."""
        watches = self._watches.get(object_key)
        if watches is None:
            hub = self._hubs.get(object_key)
            watches = self._watches[object_key] = hub.watches if hub is not None else ChangeWatches()
        return watches.start(session_id)

    def stop_watch(self, object_key: str, watch: ChangeWatch) -> None:
        watch.stop()
        watches = self._watches.get(object_key)
        if watches is not None and not watches:
            del self._watches[object_key]

    def _evict_idle(self, down_to: int | None = None) -> None:
        """Closes the least recently used idle objects until at most `down_to` (by default
        `max_open`) are open, or none idle is left."""
        bound = self._max_open if down_to is None else down_to
        if len(self._open) <= bound:
            return
        for key in list(self._open):
            if len(self._open) <= bound:
                break
            store = self._open[key]
            if store.busy or key in self._held:  # a `closed` block closes it itself
                continue
            del self._open[key]
            self._closing[key] = store
            task = asyncio.get_running_loop().create_task(self._close_evicted(key, store))
            self._closes.add(task)
            task.add_done_callback(self._closes.discard)

    async def _close_evicted(self, object_key: str, store: ObjectStore) -> None:
        """An eviction's close (its task reports a failure), then the store is forgotten."""
        try:
            await self._close(store)
        finally:
            self._forget_closing(object_key, store)

    async def _await_evicted(self, object_key: str, store: ObjectStore) -> None:
        """Waits for an evicted store's close (its failure is the eviction's to report), and
        forgets it at once: a close already done returns without yielding to the event loop,
        so waiting for the eviction task to forget it would spin."""
        with contextlib.suppress(Exception):
            await self._close(store)
        self._forget_closing(object_key, store)

    def _forget_closing(self, object_key: str, store: ObjectStore) -> None:
        if self._closing.get(object_key) is store:
            del self._closing[object_key]
            self._drop_hub_if_unused(object_key)

    # The gauges below are read by the metrics endpoint's thread while the event loop opens,
    # closes and reorders objects: they sum over a snapshot (taking it runs no Python code, so
    # no other thread can change the dict meanwhile).

    def _snapshot(self) -> tuple[ObjectStore, ...]:
        return tuple(self._open.values())

    async def _close(self, store: ObjectStore) -> None:
        try:
            await store.close()
        finally:
            with self._rows_lock:
                if store in self._unclosed:
                    self._unclosed.discard(store)
                    self._rows_of_closed += store.row_writes_since_open

    def rows_written(self) -> int:
        """Rows written (as upstream bills them) through this registry since it began: never less
        than before."""
        with self._rows_lock:
            return self._rows_of_closed + sum(s.row_writes_since_open for s in self._unclosed)

    def row_writes(self) -> int:
        return sum(store.row_writes for store in self._snapshot())

    def open_bytes(self) -> int:
        return sum(store.file_bytes() for store in self._snapshot())

    def free_bytes(self) -> int:
        """Bytes free to the server where its objects are written (`files.free_bytes`)."""
        return files.free_bytes(self.data_dir / "objects")

    def subscriber_count(self) -> int:
        return sum(hub.subscriber_count for hub in tuple(self._hubs.values()))

    def feed_retained_bytes(self) -> int:
        return self.feeds.retention.bytes

    def is_open(self, object_key: str) -> bool:
        return object_key in self._open

    def file_names_in_use(self) -> set[str]:
        """The file names of the objects open or being opened here. A new object's file has its
        name before its key is recorded, in the open: one of these found without a key is being
        made, not a stray file."""
        return {object_file_name(key) for key in (*self._opening, *self._open)}

    @contextlib.asynccontextmanager
    async def closed(self, object_key: str) -> AsyncIterator[None]:
        """Closes the object and keeps it closed for the block: requests for it wait until the
        block ends, so none writes to a file that the block replaces or removes."""
        while (held := self._held.get(object_key)) is not None:
            await held.wait()
        gate = self._held[object_key] = asyncio.Event()
        try:
            pending = self._opening.get(object_key)
            if pending is not None:  # an open under way would register the file after the block began
                await asyncio.wait([pending])  # its outcome is its waiters' business
            await self.close_object(object_key)
            yield
        finally:
            del self._held[object_key]
            gate.set()

    async def close_object(self, object_key: str) -> None:
        """Closes one object once nobody uses it (its feed subscribers are ended first); returns
        once its file is closed, also when an eviction had begun closing it."""
        watches = self._watches.get(object_key)
        if watches is not None:
            watches.note_everything()
        hub = self._hubs.pop(object_key, None)
        if hub is not None:  # subscribers end whether or not the object is open
            self._let_go(object_key, hub, FeedClosed("the object is being replaced or removed", moving=True))
        # A resume from before is told to reset, also where no feed of the object was there to
        # forget its starts: what it held may be gone without an event.
        self.feeds.quiet_starts.forget_object(object_key)
        evicted = self._closing.get(object_key)
        if evicted is not None:
            await self._await_evicted(object_key, evicted)
        store = self._open.get(object_key)
        if store is None:
            return
        # Calls still using it after the grace are stuck (a stream whose client stopped reading
        # waits for room to write, forever): the store closes under them, and their next read
        # or write is refused (StoreClosed). Queued writes still commit first (`close`).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_until_unused(store), CLOSE_GRACE_SECONDS)
        if self._open.get(object_key) is store:
            del self._open[object_key]
        await self._close(store)

    def interrupt_feeds(self) -> None:
        """Has every subscription look at its state again now (`Subscription.interrupt`)."""
        for hub in self._hubs.values():
            hub.interrupt_all()

    def close_feeds(self) -> None:
        """Ends every change-feed subscription (first step of a drain), and those of objects
        opened later: a subscription still opening its object would otherwise hold the drain."""
        self._feeds_closed = FeedClosed("the server is shutting down")
        for hub in self._hubs.values():
            hub.close_all(self._feeds_closed)

    async def close_all(self) -> None:
        """Closes every open object (after its queued writes commit)."""
        self._swept = True
        if self._wal_sweep is not None:
            self._wal_sweep.cancel()
        for task in self._wal_trims:  # the trims not begun are not begun now; begun ones end
            task.cancel()
        await asyncio.gather(*self._wal_trims, return_exceptions=True)
        stores = list(self._open.values())
        self._open.clear()
        for store in stores:
            await self._close(store)
        if self._closes:
            await asyncio.gather(*self._closes, return_exceptions=True)
        hubs = list(self._hubs.values())
        self._hubs.clear()
        for hub in hubs:
            hub.close_all(FeedClosed("the object closed"))


class _InUse:
    """A block that uses an open object (`ObjectRegistry.use`): acquired on entry, released on
    exit, however the block ends. A class, not a generator-based context manager: every call
    enters one, and an async generator costs several microseconds more to make and finish."""

    __slots__ = ("_check", "_create", "_key", "_registry", "_store")

    def __init__(
        self, registry: ObjectRegistry, object_key: str, check: Callable[[], None] | None, *, create: bool
    ) -> None:
        self._registry = registry
        self._key = object_key
        self._check = check
        self._create = create
        self._store: ObjectStore | None = None

    async def __aenter__(self) -> ObjectStore | None:
        self._store = await self._registry._acquire(self._key, self._check, create=self._create)
        return self._store

    async def __aexit__(self, *_: object) -> None:
        store, self._store = self._store, None
        if store is not None:
            discard = self._registry._release(store)
            if discard is not None:  # answered once the object is gone: a listing after it agrees
                await asyncio.shield(discard)


async def _until_unused(store: ObjectStore) -> None:
    while store.users:
        await store.idle.wait()


def _open_objects_that_fit(wanted: int) -> int:
    """`wanted`, or fewer if that many open objects would not fit in the file descriptors the
    process may have."""
    soft = fdlimit.soft_limit()
    if soft is None or wanted <= (fits := fdlimit.objects_that_fit(soft)):
        return wanted
    log.warning(
        "--max-open-objects %d needs up to %d file descriptors, more than this process may have "
        "(RLIMIT_NOFILE %d): at most %d objects will be open at once; raise the hard limit "
        "(ulimit -Hn, LimitNOFILE) to keep %d open",
        wanted,
        wanted * fdlimit.FDS_PER_OBJECT + fdlimit.RESERVED_FDS,
        soft,
        fits,
        wanted,
    )
    return fits
