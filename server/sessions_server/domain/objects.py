"""Whole objects: listing, moving between servers, ownership.

A move copies a consistent snapshot of the object's file to another server and then removes the
source. With a move lock, the source refuses writes from the snapshot on (UNAVAILABLE with
OBJECT_MOVING, which clients retry), so no acknowledged write can be left behind; after the
source is deleted it answers OBJECT_NOT_OWNED naming the destination, also after a restart
(storage/moved.py), until the object is brought back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from sessions_server.domain import keys, limits
from sessions_server.domain.errors import (
    FailedPrecondition,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    SessionsError,
    Unavailable,
    file_of_a_newer_server,
    file_of_another_object,
    object_damaged,
    permission_denied,
    storage_failure,
)
from sessions_server.domain.limits import RESPONSE_PAYLOAD_BYTES, busy, check_size, exceeded
from sessions_server.domain.placement import Placement
from sessions_server.domain.scratch_room import ScratchRoom
from sessions_server.domain.throttle import Throttle
from sessions_server.storage import datadir, files, queries
from sessions_server.storage.move_holds import Arrival, Arrivals, Departure, Departures
from sessions_server.storage.moved import MovedObjects
from sessions_server.storage.paths import is_object_file_name, object_file_name, object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import (
    NewerFileFormat,
    ObjectDamaged,
    OutOfDescriptors,
    StorageError,
    StoreClosed,
    is_out_of_space,
    shortened,
)
from sessions_server.storage.schema import ObjectKeyConflict
from sessions_server.storage.store import ObjectStore

log = logging.getLogger("sessions.objects")

EXPORT_FRAME_BYTES = RESPONSE_PAYLOAD_BYTES
DEFAULT_LEASE_SECONDS = 60
MAX_LEASE_SECONDS = 86_400  # a lock that outlives its mover by days only blocks the object's writes
MAX_MOVED_TO_BYTES = 1024
# Vacuums rewriting objects at once, server-wide; more wait their turn, their objects' writes
# going on meanwhile. A rewrite holds one of the threads that commit every object's writes (8)
# for as long as it copies the object: eight vacuums of 80 MB objects stalled an append to
# another object for 9 s.
MAX_CONCURRENT_REWRITES = 2
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# A storage failure is logged at ERROR at most once per object in this many seconds: a client
# calling again and again on a damaged object must not flood the log.
FAILURE_LOG_SECONDS = 60.0
# Storage-failure lines a window of FAILURE_LOG_SECONDS, all objects together (damaged objects
# aside: each is logged): a full disk fails every object written to, and one line per object a
# minute was thousands of ERROR lines a minute with thousands of objects in use (80 lines in
# 0.3 s for 120). Past it, failures are counted and told in one line with the next window's first.
MAX_FAILURE_LINES = 20
MAX_FAILURE_LOG_KEYS = 4096  # objects whose last logged failure is remembered, past which old ones go
SQLITE_DETAIL_CHARS = 200  # of SQLite's words quoted to the caller
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ExportFrame:
    size_bytes: int
    data: bytes
    sha256: str
    move_id: str = ""


@dataclass(frozen=True, slots=True)
class MoveRelease:
    """What AbortMove released: `held`, a lock or hold that still held; `arrival`, it was the
    hold on a copy a move brought here (this server the move's destination)."""

    held: bool
    arrival: bool


class _KeyTurn:
    """The turns of one key's whole-object changes (`ObjectAdmin._changes_of`), and how many
    hold or await one: the last lets the key's entry go."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


@dataclass(slots=True, eq=False)
class _MoveLock:
    """A locked export's hold on its object: writes are refused until `expiry` (monotonic
    seconds). `id` names it to the move's DeleteObject, which deletes only while this very lock
    holds: one released, expired or replaced by another export's no longer kept writes out of
    the copy. Written to disk (`on_disk`, `storage/move_holds.py`) as its export's last frame
    goes, so that a restart before the move's delete keeps it for the rest of its lease.

    On a move's destination (`arrival`), the hold an import took on the copy it installed, until
    the mover releases it (the source deleted) or drops the copy (the move failed); then the key
    is refused again as before the import when it had been moved away (`moved_before`). Such a
    hold never expires, and is kept on disk (`storage/move_holds.py`): restarts keep it. An import
    that replaced an object taking writes here keeps a copy of it (`kept`, a file name in the
    data directory's `held/`), put back if the copy is dropped: a failed move leaves the
    destination as it found it (a mover stalled while the object was moved here by another
    replaced that object with its stale copy, then dropped it: every write since was lost)."""

    id: str
    expiry: float
    arrival: bool = False
    moved_before: str | None = None
    on_disk: bool = False
    kept: str | None = None
    moved_before_lock: str = ""  # the lock the delete of `moved_before` ended


# Copies of one object that exports may hold at once: exports between writes each need one, and
# an export may hold its copy for a minute a frame (EXPORT_IDLE_SECONDS in the transport). A
# move's export is never refused for it: slow readers must not keep an object from moving.
MAX_EXPORT_COPIES = 4


@dataclass(slots=True, eq=False)
class _ExportCut:
    """Set for an export under way when its object is erased: it sends nothing more. An export
    that had begun sent the whole erased object after the erase returned (206 MB, 67 frames)."""

    erased: bool = False

    def check(self) -> None:
        if self.erased:
            raise NotFound(
                "the object was erased while it was being exported: nothing more of it is sent", field="object_key"
            )


@dataclass(slots=True, eq=False)
class _SharedCopy:
    """A copy of an object's file in scratch, made for an export and shared by the exports that
    begin while the object stays as it was when it was begun (the same store, no commit since):
    each export made its own, and 10 exports of a 219 MB object took 2.1 GB of scratch in 1.9 s.
    Removed once its last export is done with it."""

    store: ObjectStore
    commits: int
    made: asyncio.Future[Path]
    users: int = 0

    def is_current(self, store: ObjectStore) -> bool:
        failed = self.made.done() and (self.made.cancelled() or self.made.exception() is not None)
        return self.store is store and self.commits == store.commits and not failed


class ObjectAdmin:
    """Object-level operations and the admission rules they imply for every other call."""

    def __init__(
        self,
        registry: ObjectRegistry,
        *,
        placement: Placement | None = None,
        max_object_key_bytes: int = keys.MAX_OBJECT_KEY_BYTES,
        max_object_bytes: int = 0,
        text_limits: Sequence[files.TextLimit] = (),
        read_back: files.ReadBack | None = None,
    ) -> None:
        self._registry = registry
        self._placement = placement
        self._max_object_key_bytes = max_object_key_bytes
        self._max_object_bytes = max_object_bytes  # 0: none
        self._text_limits = tuple(text_limits)
        self._read_back = read_back
        self._moving: dict[str, _MoveLock] = {}
        # Objects whose move lock AbortMove released while it held: the move's delete must not follow.
        self._aborted: set[str] = set()
        # The exports under way, by object: an erase ends them (`_ExportCut`).
        self._exports: dict[str, set[_ExportCut]] = {}
        self._changing: dict[str, _KeyTurn] = {}  # `_changes_of`
        self._moved = MovedObjects(registry.data_dir)
        self._arrivals = Arrivals(registry.data_dir)
        for key, arrival in self._arrivals.held().items():  # held across the restart
            self._moving[key] = _MoveLock(
                arrival.hold,
                math.inf,
                arrival=True,
                moved_before=arrival.moved_before,
                kept=arrival.kept,
                moved_before_lock=arrival.moved_before_lock,
            )
        files.remove_files_but(  # copies a crash left after their hold ended
            registry.data_dir / datadir.HELD_DIR_NAME,
            {arrival.kept for arrival in self._arrivals.held().values() if arrival.kept is not None},
        )
        self._departures = Departures(registry.data_dir)
        self._restore_departures()
        self._copies: dict[str, _SharedCopy] = {}  # the newest copy of each object being exported
        self._copies_held: dict[str, int] = {}  # copies of each object that exports still use
        self._room = ScratchRoom(registry.data_dir / datadir.SCRATCH_DIR_NAME)
        self._rewrite_slots = asyncio.Semaphore(MAX_CONCURRENT_REWRITES)
        self._failures_logged = Throttle(FAILURE_LOG_SECONDS, MAX_FAILURE_LOG_KEYS)
        self._lines_since = 0.0  # when the current window of storage-failure lines began
        self._lines = 0  # storage-failure lines logged in it
        self._unlogged = 0  # objects whose failures were counted instead, past MAX_FAILURE_LINES

    def _restore_departures(self) -> None:
        """Takes back the move locks held across the restart, for what is left of each lease
        (blocking; at startup): a lock whose lease ran out, or whose move's delete was recorded,
        is done with."""
        now_wall, now = time.time(), time.monotonic()
        for key, departure in self._departures.held().items():
            # By the wall clock, which a clock set back across the restart stretches (by hours):
            # bounded by what the lease had left when it was written.
            bound = MAX_LEASE_SECONDS if departure.left is None else departure.left
            left = min(departure.until - now_wall, bound)
            if left <= 0 or key in self._moved or key in self._moving:
                self._departures.end(key, departure.lock)
                continue
            self._moving[key] = _MoveLock(departure.lock, now + left, on_disk=True)
            log.info(
                "%r: locked for a move across the restart, for %d s more at most (abort-move releases it)", key, left
            )

    @property
    def data_dir(self) -> Path:
        return self._registry.data_dir

    def set_moved_leftovers_aside(self) -> list[tuple[str, Path]]:
        """Moves out of the way the files of objects recorded as moved away whose delete may
        have been cut short (a crash after the record, before the files went, or before they
        were noted gone): they would stay, unlisted and refused, for good. Set aside in
        `<data-dir>/set-aside/`, not deleted: an older server's offline import-store brought
        objects back without clearing their record. Blocking; at startup, before anything is
        served. Returns (key, where its file went) for each."""
        aside = self.data_dir / datadir.SET_ASIDE_DIR_NAME
        found = []
        looked = self._moved.unsettled()
        for key in looked:
            where = files.set_object_files_aside(object_path(self.data_dir, key), aside)
            if where is not None:
                found.append((key, where))
        self._moved.settle(looked)
        return found

    def is_stored(self, object_key: str) -> bool:
        """Whether the object has a file here (it was written, and not removed since)."""
        return self._registry.is_open(object_key) or object_path(self.data_dir, object_key).exists()

    def admit(self, object_key: str, *, writing: bool, arriving: bool = False) -> None:
        """Refuses calls for objects this server does not own, has moved away, or is moving.
        `arriving`: the object is being brought (back) here, which a move away does not bar."""
        if self._placement is not None:
            self._placement.check(object_key)
        moved_to = None if arriving else self._moved.where(object_key)
        if moved_to is not None:
            raise FailedPrecondition(
                f"the object was moved to {moved_to or 'another server'}", reason="OBJECT_NOT_OWNED", owner=moved_to
            )
        if writing:
            lock = self._moving.get(object_key)  # an expired lock stays: a delete then refuses
            # A copy held for a move's end gives way to the next import (a move run again).
            if lock is not None and time.monotonic() < lock.expiry and not (arriving and lock.arrival):
                if lock.arrival:
                    raise Unavailable(
                        "the object is arriving by a move: this copy takes writes once the move ends; retry shortly",
                        reason="OBJECT_MOVING",
                    )
                raise Unavailable("the object is being moved; retry shortly", reason="OBJECT_MOVING")

    @contextlib.asynccontextmanager
    async def _changes_of(self, object_key: str) -> AsyncIterator[None]:
        """One change of a whole object at a time (an import's install, a delete, an erase, an
        AbortMove), each checking the object's state once it has its turn: one that checked
        first and then waited (for a file to arrive, for calls to end) acted on a state another
        had changed meanwhile (a delete's record forgotten by an import installed under it, an
        import's held copy erased)."""
        turn = self._changing.get(object_key)
        if turn is None:
            turn = self._changing[object_key] = _KeyTurn()
        turn.waiting += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.waiting -= 1
            if not turn.waiting:
                del self._changing[object_key]

    async def list_keys(self, page_size: int, page_token: str) -> tuple[list[str], str]:
        size = limits.page_size(page_size, default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)
        if page_token and not is_object_file_name(page_token):
            # Taken as a bound, any other text would give a wrong page, or an empty one that
            # looks like the end of the list.
            raise InvalidArgument("page_token is not one this server issued", field="page_token")

        def page() -> tuple[list[Path], list[str | None]]:  # one thread hop a page, not one a file
            paths = files.list_object_files(self.data_dir, page_token, size)
            return paths, [files.recorded_object_key(path) for path in paths]

        paths, keys_found = await asyncio.to_thread(page)
        found = []
        in_use: set[str] | None = None  # the names of the files open here, once one has no key
        for path, key in zip(paths, keys_found, strict=True):
            # A listing that leaves out an object must say so somewhere; once a minute a file,
            # however often it is listed (every call logged every such file again). Not a new
            # object's file, whose key its open has yet to record: listed once it has; nor one
            # gone since it was listed (an erase, a move's delete).
            if key is None:
                if in_use is None:
                    in_use = self._registry.file_names_in_use()
                if path.name not in in_use and path.exists() and self._due_for_log(f"listing\0{path}"):
                    log.warning("%s records no object key it can read: not listed", path)
                continue
            if key in self._moved:
                continue
            if object_file_name(key) != path.name:  # a copy of another key's file: no call reaches it
                if self._due_for_log(f"listing\0{path}"):
                    log.warning("%s records object key %r, which is not its own: not listed", path, key)
                continue
            found.append(key)
        token = paths[-1].name if len(paths) == size else ""
        return found, token

    async def export(self, object_key: str, *, lock_for_move: bool, lease_seconds: int) -> AsyncGenerator[ExportFrame]:
        """A consistent copy of the object's file in frames; the last frame carries the digest."""
        keys.check_object_key(object_key, max_bytes=self._max_object_key_bytes)
        lease = _lease(lease_seconds)
        self.admit(object_key, writing=lock_for_move)
        cut = _ExportCut()
        exports = self._exports.setdefault(object_key, set())
        exports.add(cut)
        try:
            async with contextlib.aclosing(self._export(object_key, lock_for_move, lease, cut)) as frames:
                async for frame in frames:  # closed with this one: its lock and copy let go at once
                    yield frame
        finally:
            exports.discard(cut)
            if not exports and self._exports.get(object_key) is exports:
                del self._exports[object_key]

    async def _export(
        self, object_key: str, lock_for_move: bool, lease: float, cut: _ExportCut
    ) -> AsyncGenerator[ExportFrame]:
        path = object_path(self.data_dir, object_key)
        again = functools.partial(self.admit, object_key, writing=lock_for_move)
        lock = _MoveLock(uuid.uuid4().hex, math.inf)
        async with self._stored(object_key, again) as store:
            if store is None:
                raise NotFound("no such object on this server", field="object_key")
            try:
                if lock_for_move:
                    lock.expiry = time.monotonic() + lease
                    self._moving[object_key] = lock
                    self._aborted.discard(object_key)  # a new move: its own delete may follow
                    # Every later write to this store is refused as it is queued (also those of
                    # calls admitted before the lock, an import stream's next chunk among them);
                    # those queued before it commit first.
                    store.write_gate = functools.partial(self.admit, object_key, writing=True)
                    await store.settled()
                shared = await self._take_copy(object_key, store, path, for_move=lock_for_move)
                try:
                    copy = await _run_to_end(shared.made)
                except BaseException:
                    self._leave_copy(object_key, shared)
                    raise
            except BaseException as exc:  # failed, or the caller gave up: no copy, no move
                if lock_for_move:
                    self._release(object_key, lock)  # the object takes writes again
                if isinstance(exc, StorageError):
                    raise self.open_failure(exc, object_key) from None
                raise
        sent = False
        try:
            size = copy.stat().st_size
            digest = hashlib.sha256()
            first = True
            with copy.open("rb") as stream:
                while chunk := await _finish_in_thread(self._read_to_send, stream, digest):
                    cut.check()
                    yield ExportFrame(size if first else 0, chunk, "")
                    first = False
                    # The lease runs from the last frame sent; a lock released or expired
                    # meanwhile is not taken again (the copy may now miss writes).
                    now = time.monotonic()
                    if lock_for_move and self._moving.get(object_key) is lock and now < lock.expiry:
                        lock.expiry = now + lease
            cut.check()
            if lock_for_move:
                await self._note_departure(object_key, lock)
            yield ExportFrame(size if first else 0, b"", digest.hexdigest(), lock.id if lock_for_move else "")
            sent = True
        except OSError as exc:  # reading the copy made for it: the disk
            self.note_storage_failure(object_key, "export", str(exc))
            raise storage_failure(
                f"the object's copy could not be read: {self.without_paths(str(exc))}",
                out_of_space=is_out_of_space(exc),
            ) from None
        finally:
            self._leave_copy(object_key, shared)
            if lock_for_move and not sent:  # cut short (the mover gone): no move can follow it
                self._release(object_key, lock)
                with contextlib.suppress(SessionsError):  # noted; a restart keeps it for its lease at most
                    await self._forget_departure(object_key, lock)

    async def vacuum(self, object_key: str) -> tuple[int, int]:
        """Rewrites the object's file with only the pages in use (VacuumObject). Returns the
        bytes of its file and WAL before and after."""
        keys.check_object_key(object_key, max_bytes=self._max_object_key_bytes)
        self.admit(object_key, writing=True)
        again = functools.partial(self.admit, object_key, writing=True)
        async with self._stored(object_key, again) as store:
            if store is None:
                raise NotFound("no such object on this server", field="object_key")
            before = store.file_bytes()
            try:
                scratch = self.data_dir / datadir.SCRATCH_DIR_NAME
                await store.rewrite_compactly(scratch, functools.partial(self._rewrite_turn, store))
            except OSError as exc:
                raise storage_failure(
                    f"{exc.strerror or exc}; the object is as it was", out_of_space=is_out_of_space(exc)
                ) from None
            except StorageError as exc:
                raise self.open_failure(exc, object_key) from None
            return before, store.file_bytes()

    @contextlib.asynccontextmanager
    async def _rewrite_turn(self, store: ObjectStore) -> AsyncIterator[None]:
        """A rewrite's turn (`ObjectStore.rewrite_compactly`): one of the server's rewrite
        slots, then room on the disk for the copy of the pages in use in scratch and the same
        pages again in the WAL until its checkpoint, measured then; both held until it ends."""
        async with self._rewrite_slots:
            in_use = await store.read(queries.bytes_in_use, quick=True)
            with self._room.reserved_for(2 * in_use, "rewriting this object"):
                yield

    async def _take_copy(self, object_key: str, store: ObjectStore, path: Path, *, for_move: bool) -> _SharedCopy:
        """The copy of the object as it stands, shared with the exports under way when the
        object has not changed since theirs was begun, else begun now (on a thread, to its end
        whoever stays to wait for it), if the disk has room for it."""
        shared = self._copies.get(object_key)
        if shared is not None and shared.is_current(store):
            shared.users += 1
            return shared
        size = await store.read(queries.database_bytes, quick=True)
        shared = self._copies.get(object_key)  # another export may have begun one meanwhile
        if shared is None or not shared.is_current(store):
            held = self._copies_held_below_bound(object_key, for_move)
            try:
                self._room.reserve(size, "the export's copy of this object")
            except OSError as exc:
                raise storage_failure(
                    f"{exc.strerror or exc}; nothing was copied", out_of_space=is_out_of_space(exc)
                ) from None
            self._copies_held[object_key] = held + 1
            commits = store.commits  # before the copy begins: it holds at least those commits
            # The rows written as of those commits: a write landing during the copy (none while
            # a move holds the object's writes) may be in the copy and not in its count.
            made = asyncio.ensure_future(
                asyncio.to_thread(
                    files.snapshot_object, path, self.data_dir / datadir.SCRATCH_DIR_NAME, store.row_writes
                )
            )
            made.add_done_callback(lambda _: self._room.release(size))  # written: the disk shows it now
            shared = self._copies[object_key] = _SharedCopy(store, commits, made)
        shared.users += 1
        return shared

    def _copies_held_below_bound(self, object_key: str, for_move: bool) -> int:
        """The copies of the object exports hold; LimitExceeded when one more is not let in."""
        held = self._copies_held.get(object_key, 0)
        if held >= MAX_EXPORT_COPIES and not for_move:
            raise busy(
                f"exports under way hold {held} copies of this object, made between writes to it "
                f"(max_export_copies_per_object, {MAX_EXPORT_COPIES}); retry once one has ended",
                "max_export_copies_per_object",
                MAX_EXPORT_COPIES,
            )
        return held

    def _leave_copy(self, object_key: str, shared: _SharedCopy) -> None:
        shared.users -= 1
        if shared.users > 0:
            return
        if self._copies.get(object_key) is shared:
            del self._copies[object_key]
        held = self._copies_held.pop(object_key) - 1
        if held:
            self._copies_held[object_key] = held
        shared.made.add_done_callback(_remove_copy)  # once made, if it is still being made

    @contextlib.asynccontextmanager
    async def _stored(self, object_key: str, again: Callable[[], None]) -> AsyncIterator[ObjectStore | None]:
        """The object's store, None when it has no file here (never an open that creates: an
        erase can take the object away while this waits); a file that fails to open is
        answered as any call's (`open_failure`)."""
        try:
            async with self._registry.use_existing(object_key, again) as store:
                yield store
        except (StorageError, ObjectKeyConflict) as exc:
            raise self.open_failure(exc, object_key) from None

    def open_failure(self, exc: StorageError | ObjectKeyConflict, object_key: str) -> SessionsError:
        """The answer to a store failing as it is opened or used: whatever a call was doing,
        the same failure gets the same code and reason. A failure of the disk or the file is
        logged (`note_storage_failure`); a damaged file's object is quarantined (the store or
        the registry has done so where it found the damage; an export's copy has not)."""
        if isinstance(exc, StoreClosed):
            return Unavailable(f"{exc} (replaced or removed, or the server stopping); retry", reason="OBJECT_MOVING")
        if isinstance(exc, OutOfDescriptors):  # refused before anything was done, as a busy server refuses
            return LimitExceeded(str(exc), reason="SERVER_BUSY")
        if isinstance(exc, ObjectKeyConflict):
            path = object_path(self.data_dir, exc.object_key)
            # The key the file records stays in the log: the caller's token may not grant it.
            # Only the operator can act (move or erase the file), so it is logged as storage
            # failures are: at ERROR, once a minute an object (each call opens the file again).
            if self._due_for_log(f"another object's file\0{object_key}"):
                log.error(
                    "%s records object key %r, not %r: every call on it is refused (FAILED_PRECONDITION) "
                    "and the file is left alone",
                    path,
                    exc.recorded_key,
                    exc.object_key,
                )
            return file_of_another_object(str(path.relative_to(self.data_dir)))
        relative = self.relative_file(object_key)
        if isinstance(exc, NewerFileFormat):
            # Not damage, so no quarantine: the file is fine, this server is too old for it (each
            # call's open finds that again, reading only). Only the operator can act (run a newer
            # server), so it is logged as storage failures are: at ERROR, once a minute an object.
            if self._due_for_log(object_key):
                log.error(
                    "object of a newer server: object %r, file %s: %s; every call on it is refused "
                    "(FAILED_PRECONDITION) and the file is left as it is",
                    object_key,
                    relative,
                    exc,
                )
            return file_of_a_newer_server(relative, shortened(exc.recorded, 32), exc.known)
        if isinstance(exc, ObjectDamaged):
            if not exc.judged:  # found outside the registry's stores (an export's copy, say)
                self._registry.quarantine(object_key, exc)
            self.note_storage_failure(object_key, exc.operation, str(exc), damaged=True)
            return object_damaged(relative, shortened(str(exc), SQLITE_DETAIL_CHARS), foreign=exc.foreign)
        self.note_storage_failure(object_key, exc.operation, str(exc))
        if exc.permission_denied:
            return permission_denied(relative)
        return storage_failure(self.without_paths(str(exc)), out_of_space=exc.out_of_space)

    def relative_file(self, object_key: str) -> str:
        """The object's file as its path inside the data directory: what errors name (the
        server's own paths are not the caller's business)."""
        return str(object_path(self.data_dir, object_key).relative_to(self.data_dir))

    def without_paths(self, text: str) -> str:
        """`text` (an OS or SQLite error) with the data directory's absolute path taken out of
        the paths it names: they become relative to the data directory."""
        for prefix in {str(self.data_dir.absolute()), str(self.data_dir.resolve()), str(self.data_dir)}:
            if prefix not in ("", "."):
                text = text.replace(prefix.rstrip("/") + "/", "")
        return text

    def note_storage_failure(self, object_key: str, operation: str, detail: str, *, damaged: bool = False) -> None:
        """Logs a failure of the disk or of an object's file at ERROR, at most once per object
        per FAILURE_LOG_SECONDS (its later calls are refused the same way, unlogged), with what
        the operator needs: the key, its file (relative to the data directory), the operation
        and SQLite's or the OS's own words. Alert on these lines: "object damaged: ..." and
        "storage failure: ..." (logger `sessions.objects`)."""
        # Damage is logged whatever the bound: each such object is quarantined, and an operator
        # must learn which to restore.
        if not self._due_for_log(object_key) or (not damaged and not self._line_allowed()):
            return
        relative = self.relative_file(object_key)
        if not damaged and self._lines == MAX_FAILURE_LINES:  # the window's last line
            detail += (
                f"; further storage failures of other objects in the next {int(FAILURE_LOG_SECONDS)} s are "
                "counted, not logged one by one"
            )
        if damaged:
            log.error(
                "object damaged: object %r, file %s, during %s: %s; every call on it is refused (DATA_LOSS, "
                "OBJECT_DAMAGED) until it is restored (ImportObject with replace) or erased (DeleteObject with erase)",
                object_key,
                relative,
                operation or "a call",
                detail,
            )
        else:
            log.error(
                "storage failure: object %r, file %s, during %s: %s",
                object_key,
                relative,
                operation or "a call",
                detail,
            )

    def _line_allowed(self) -> bool:
        """Whether a storage-failure line may be logged now (MAX_FAILURE_LINES a window); counts
        the failure when not, and tells the count of the window before at the next line."""
        now = time.monotonic()
        if now - self._lines_since >= FAILURE_LOG_SECONDS:
            if self._unlogged:
                log.error(
                    "storage failures of %d more objects were not logged one by one (at most %d lines in %d s); "
                    "their calls were refused as those logged",
                    self._unlogged,
                    MAX_FAILURE_LINES,
                    int(FAILURE_LOG_SECONDS),
                )
            self._lines_since, self._lines, self._unlogged = now, 0, 0
        if self._lines >= MAX_FAILURE_LINES:
            self._unlogged += 1
            return False
        self._lines += 1
        return True

    def _due_for_log(self, object_key: str) -> bool:
        """Whether a failure of the object is to be logged: none was in the last
        FAILURE_LOG_SECONDS (noted as logged now when so)."""
        return self._failures_logged.due(object_key)

    def _release(self, object_key: str, lock: _MoveLock) -> None:
        """Drops `lock`, if it is still the object's (not another export's since)."""
        if self._moving.get(object_key) is lock:
            del self._moving[object_key]

    async def _note_departure(self, object_key: str, lock: _MoveLock) -> None:
        """Writes the move lock to disk before the export's last frame names it to the mover.
        One released or run out meanwhile ends the export instead: the copy may miss writes
        taken since, and its mover, stalled while the object was moved again, would install it
        at the destination (with replace, over the object another move brought there: every
        write since was lost when the failed move then dropped its copy)."""
        now = time.monotonic()
        if self._moving.get(object_key) is not lock or now >= lock.expiry:
            raise _lock_lost_mid_export()
        departure = Departure(lock.id, time.time() + (lock.expiry - now), lock.expiry - now)
        await self._change_holds(object_key, "recording the move lock", self._departures.hold, departure)
        lock.on_disk = True
        if self._moving.get(object_key) is not lock:  # released while it was written
            await self._forget_departure(object_key, lock)
            raise _lock_lost_mid_export()

    async def _forget_departure(self, object_key: str, lock: _MoveLock | None) -> None:
        """Takes a move lock that is done with off the disk (a newer lock on the key stays)."""
        if lock is not None and lock.on_disk:
            await self._change_holds(object_key, "ending the move lock", self._departures.end, lock.id)
            lock.on_disk = False

    async def receive(
        self,
        object_key: str,
        frames: AsyncIterator[tuple[bytes, str]],
        *,
        replace: bool,
        hold_for_move: bool = False,
    ) -> tuple[int, int, str]:
        """Writes a received file, verifies its digest and integrity, installs it. Returns
        (bytes received, message rows, the hold's id). `hold_for_move`: the installed object
        refuses writes until the mover releases it (`abort_move`) or drops it (`erase` naming
        the hold), restarts included."""
        keys.check_object_key(object_key, max_bytes=self._max_object_key_bytes)
        self._check_not_departing(object_key, hold_for_move)
        self.admit(object_key, writing=True, arriving=True)
        admitted = self._moved_record(object_key)
        if not (replace or admitted is not None) and self.is_stored(object_key):
            raise _already_here()  # before the file is sent, not after
        scratch = self.data_dir / datadir.SCRATCH_DIR_NAME
        scratch.mkdir(parents=True, exist_ok=True)
        partial = scratch / f"import-{hashlib.sha256(object_key.encode()).hexdigest()}-{time.monotonic_ns()}"
        digest = hashlib.sha256()
        size = 0
        expected = ""
        try:
            with partial.open("wb") as out:
                async for data, sha in frames:
                    size += len(data)
                    if self._max_object_bytes and size > self._max_object_bytes:
                        # An object past it refuses every write, and the disk is not the sender's to fill.
                        raise exceeded(
                            "the received file is larger than an object may be",
                            "max_object_bytes",
                            self._max_object_bytes,
                            "bytes",
                        )
                    await _finish_in_thread(self._write_received, out, digest, data)
                    expected = sha or expected
            if not expected:
                raise InvalidArgument(
                    "the last ImportObject frame must carry sha256", reason="INVALID_STREAM", field="sha256"
                )
            if expected != digest.hexdigest():
                raise InvalidArgument(
                    "the received file does not match its sha256", reason="INVALID_STREAM", field="sha256"
                )
            try:
                # Installed from a copy of the received file, staged in scratch too, and
                # rewritten once more beside it when its pages are not this server's size.
                # With a copy kept of the object it replaces, room for that too.
                kept_bytes = self._bytes_to_keep(object_key) if hold_for_move else 0
                rewrite_bytes = 0 if await asyncio.to_thread(files.has_server_pages, partial) else size
                with self._room.reserved_for(size + rewrite_bytes + kept_bytes, "installing the received file"):
                    async with self._changes_of(object_key), self._registry.closed(object_key):
                        # Kept closed until the file is in place, even if the caller gives up:
                        # a request let in meanwhile would write to the file being replaced.
                        replace = self._check_arrival(object_key, admitted, replace, hold_for_move)
                        held = self._moving.get(object_key)  # an earlier run's held copy, replaced
                        earlier = held if held is not None and held.arrival else None
                        kept = earlier.kept if earlier is not None else None
                        if hold_for_move and earlier is None and object_key not in self._moved:
                            kept = await _finish_in_thread(self._keep_replaced, object_key)
                        try:
                            hold = await self._hold_arrival(object_key, earlier, kept) if hold_for_move else ""
                        except BaseException:
                            self._remove_kept(kept if earlier is None else None)
                            raise
                        try:
                            rows = await _finish_in_thread(self._install, partial, object_key, replace)
                            self._registry.forget_damage(object_key)  # replaced: a damaged file is gone
                        except BaseException as exc:
                            if (
                                hold
                                and not isinstance(exc, files.StoreImportError)  # refused before replacing
                                and kept is None
                                and earlier is None
                                # Forgotten by `_install` once its file is in place: else a file here
                                # is what a delete cut short left, not the copy.
                                and object_key not in self._moved
                                and await asyncio.to_thread(object_path(self.data_dir, object_key).exists)
                            ):
                                # The copy is in place (the caller gone once it was installed, or a
                                # failure after): nothing was here to put back, and ending the hold
                                # would let it take writes while the mover, never told the hold,
                                # releases its source. Held, read-only, until an operator acts.
                                log.warning(
                                    "%r: an import for a move failed or was cancelled after its copy was "
                                    "installed: the copy stays held, read-only (hold %s); drop it (DeleteObject "
                                    "with erase and move_id %s) or move the object again with --replace",
                                    object_key,
                                    hold,
                                    hold,
                                )
                                if isinstance(exc, OSError | StorageError):
                                    raise self._held_install_failed(object_key, hold, exc) from None
                                raise
                            if hold:  # nothing arrived: the key is as it was
                                # A failure past the file's checks may have come after it replaced the object.
                                if kept is not None and earlier is None and not isinstance(exc, files.StoreImportError):
                                    try:
                                        await _finish_in_thread(self._install_kept, object_key, kept)
                                    except Exception:  # held, read-only, until an operator looks: its copy kept
                                        log.exception(
                                            "%r: the object an import replaced could not be put back", object_key
                                        )
                                        raise exc from None
                                await self._end_arrival(object_key, earlier)
                                self._remove_kept(kept if earlier is None else None)
                            raise
                        if earlier is not None and not hold:  # replaced by an object taking writes
                            await self._end_arrival(object_key, None)
                            self._remove_kept(earlier.kept)
            except files.OversizedText as exc:
                raise InvalidArgument(
                    f"the received file cannot be served here: {exc}; nothing was installed",
                    reason="LIMIT_EXCEEDED",
                    field="data",
                    limit=exc.limit.name,
                    limit_value=str(exc.limit.max_bytes),
                ) from None
            except files.ObjectExists:  # stored while the file arrived
                raise _already_here() from None
            except files.StoreImportError as exc:
                # The message names the staged copy's path: the caller has no use for this server's paths.
                detail = str(exc).replace(str(partial), "it")
                raise InvalidArgument(f"the received file cannot be served: {detail}", field="data") from None
        except (OSError, StorageError) as exc:  # the disk (full, failing), not the file
            self.note_storage_failure(object_key, "import", str(exc))
            raise storage_failure(
                f"the received file could not be stored: {self.without_paths(str(exc))}",
                out_of_space=is_out_of_space(exc),
            ) from None
        finally:
            partial.unlink(missing_ok=True)
        return size, rows, hold

    def _moved_record(self, object_key: str) -> tuple[str, str] | None:
        """Where the object was moved away to, and by which lock; None while it is here."""
        if object_key not in self._moved:
            return None
        return self._moved.where(object_key) or "", self._moved.move_id(object_key)

    def _check_not_departing(self, object_key: str, for_move: bool) -> None:
        """Refuses a move's import (`for_move`) of an object this server is moving away: most
        often a move whose destination is its source under another address (`localhost` for
        `127.0.0.1`), which, refused as moving ("retry shortly", or release the lock and move
        again), met the same refusal every time. Another import waits for that move's end, as
        writes do (`admit`)."""
        lock = self._moving.get(object_key)
        if for_move and lock is not None and not lock.arrival and time.monotonic() < lock.expiry:
            raise _moving_away_from_here()

    def _check_arrival(self, object_key: str, admitted: tuple[str, str] | None, replace: bool, for_move: bool) -> bool:
        """Checks again, as an import's install has its turn, what its admission checked before
        its file arrived. Raises when the object is being moved away from here (OBJECT_DEPARTING,
        or OBJECT_MOVING for an import that is not a move's) or went elsewhere since
        (OBJECT_NOT_OWNED: installed, this copy would take writes beside the one the move left
        at its destination). Returns whether the install replaces a file here: asked to, or what
        is here is what a move away left (a move back), as it still is (an object brought back
        meanwhile takes writes: not replaced unless asked)."""
        self._check_not_departing(object_key, for_move)
        self.admit(object_key, writing=True, arriving=True)
        now = self._moved_record(object_key)
        if now is not None and now != admitted:
            raise FailedPrecondition(
                f"the object was moved to {now[0] or 'another server'} while this import was received: "
                "nothing was installed",
                reason="OBJECT_NOT_OWNED",
                owner=now[0],
            )
        # A file left by a delete cut short after it was recorded (the key refused since) is no
        # object here: a move back replaces it.
        return replace or now is not None

    def _held_install_failed(self, object_key: str, hold: str, exc: OSError | StorageError) -> SessionsError:
        """The answer to a storage failure after a move's copy was installed and held: the
        mover, told the hold (ErrorInfo metadata `move_id`), can drop the copy."""
        self.note_storage_failure(object_key, "import", str(exc))
        return storage_failure(
            f"the received file was installed, but the import failed after it: {self.without_paths(str(exc))}; "
            f"the copy stays here read-only, held for the move (move_id {hold}): drop it with DeleteObject "
            "(erase and that move_id), or move the object again with replace",
            out_of_space=is_out_of_space(exc),
            move_id=hold,
        )

    async def _hold_arrival(self, object_key: str, earlier: _MoveLock | None, kept: str | None) -> str:
        """Holds the key for the copy about to be installed (`receive`), on disk first: a
        restart between the install and the move's end keeps the copy read-only. A hold
        `earlier` (a move run again) passes on where the key had been moved to before, and the
        lock that delete ended; `kept`, the copy of the object the import replaces, to be put
        back if the move fails."""
        hold = uuid.uuid4().hex
        if earlier is not None:
            moved_before, before_lock = earlier.moved_before, earlier.moved_before_lock
        else:
            moved_before, before_lock = self._moved.where(object_key), self._moved.move_id(object_key)
        arrival = Arrival(hold, moved_before, kept, before_lock)
        await self._change_holds(object_key, "recording the import's hold", self._arrivals.hold, arrival)
        self._moving[object_key] = _MoveLock(
            hold, math.inf, arrival=True, moved_before=moved_before, kept=kept, moved_before_lock=before_lock
        )
        self._aborted.discard(object_key)
        return hold

    async def _end_arrival(self, object_key: str, restored: _MoveLock | None) -> None:
        """Ends the key's hold on disk, or puts back `restored` (the hold an import failed to
        replace)."""
        if restored is None:
            await self._change_holds(object_key, "ending the import's hold", self._arrivals.end)
            self._moving.pop(object_key, None)
        else:
            arrival = Arrival(restored.id, restored.moved_before, restored.kept, restored.moved_before_lock)
            await self._change_holds(object_key, "recording the import's hold", self._arrivals.hold, arrival)
            self._moving[object_key] = restored

    def _keep_replaced(self, object_key: str) -> str | None:
        """A durable copy of the object an import is about to replace (closed meanwhile), in
        `held/`, or None when it has no file. Blocking: a worker thread."""
        path = object_path(self.data_dir, object_key)
        if not path.exists():
            return None
        kept = files.keep_copy(path, self.data_dir / datadir.HELD_DIR_NAME)
        return None if kept is None else kept.name

    def _bytes_to_keep(self, object_key: str) -> int:
        """About what a copy of the object an import with hold_for_move replaces takes."""
        held = self._moving.get(object_key)
        if object_key in self._moved or (held is not None and held.arrival):
            return 0  # no copy kept: a moved object's leftovers, or a held copy's (its own kept)
        try:
            return object_path(self.data_dir, object_key).stat().st_size
        except OSError:
            return 0

    def _install_kept(self, object_key: str, kept: str) -> None:
        """Installs the kept copy of the object an import replaced (the object closed meanwhile)."""
        self._install(self.data_dir / datadir.HELD_DIR_NAME / kept, object_key, True)

    def _remove_kept(self, kept: str | None) -> None:
        if kept is not None:
            with contextlib.suppress(OSError):  # a start removes it if it stays
                files.remove_object_files(self.data_dir / datadir.HELD_DIR_NAME / kept)

    async def _change_holds(self, object_key: str, what: str, change: Callable[..., None], *args: Any) -> None:
        """`change(object_key, *args)`, a write of ARRIVING or DEPARTING, on a worker thread; a
        disk that fails it is answered as any storage failure (it was INTERNAL)."""
        try:
            await _finish_in_thread(change, object_key, *args)
        except OSError as exc:
            self.note_storage_failure(object_key, what, str(exc))
            raise storage_failure(
                f"{what} failed: {self.without_paths(str(exc))}", out_of_space=is_out_of_space(exc)
            ) from None

    # A file's frames are read or written, and hashed, on a worker thread: a write may wait for
    # the disk (seconds, when the kernel throttles dirty pages) and hashing 3 MiB takes ~6 ms,
    # and on the event loop either stalled every call (an import of 2.5 GB: 4.5 s at worst).
    @staticmethod
    def _read_to_send(stream: BinaryIO, digest: hashlib._Hash) -> bytes:
        chunk = stream.read(EXPORT_FRAME_BYTES)
        digest.update(chunk)
        return chunk

    def _write_received(self, out: BinaryIO, digest: hashlib._Hash, data: bytes) -> None:
        self._room.check(len(data), "the received file")
        out.write(data)
        digest.update(data)

    def _install(self, partial: Path, object_key: str, replace: bool) -> int:
        """Installs a received file, then notes the object is here again (a crash between the
        two leaves it refused, and the next import replaces it). Returns its message rows,
        counted while the object is still closed to calls: an erase let in afterwards would
        take the file from under the count, and an installed import would be answered as failed."""
        target = files.import_store_file(
            partial,
            object_key,
            self.data_dir,
            replace=replace,
            text_limits=self._text_limits,
            read_back=self._read_back,
        )
        self._moved.forget(object_key)
        return files.count_message_rows(target)

    async def abort_move(self, object_key: str, *, source_lock_only: bool = False) -> MoveRelease:
        """Releases a move lock, or a move's hold on its arrival (unless `source_lock_only`:
        refused then, changing nothing)."""
        keys.check_object_key(object_key, max_bytes=self._max_object_key_bytes)
        async with self._changes_of(object_key):
            return await self._abort_move(object_key, source_lock_only)

    async def _abort_move(self, object_key: str, source_lock_only: bool) -> MoveRelease:
        self.admit(object_key, writing=False)
        lock = self._moving.get(object_key)
        if source_lock_only and lock is not None and lock.arrival:
            raise FailedPrecondition(
                "this server holds the copy a move brought here (read-only until the move ends), not a move's "
                "source lock: nothing was released. Release that hold only once the move's source refuses the "
                "key (the move happened: abort-move --release-hold); while the source still holds the object, "
                "run the move again with --replace, or drop this copy",
                reason="FAILED_PRECONDITION",
            )
        if lock is not None and lock.arrival:  # on disk first: a restart must not hold it again
            await self._change_holds(object_key, "ending the import's hold", self._arrivals.end)
        await self._forget_departure(object_key, lock)
        if self._moving.get(object_key) is lock:
            self._moving.pop(object_key, None)
        if lock is not None and lock.arrival:  # the move happened: what it replaced is gone for good
            await _finish_in_thread(self._remove_kept, lock.kept)
        held = lock is not None and time.monotonic() < lock.expiry
        if held and lock is not None and not lock.arrival:
            self._aborted.add(object_key)
        else:  # none held (or it had expired), or a move's end here: a plain delete may follow
            self._aborted.discard(object_key)
        return MoveRelease(held=held, arrival=held and lock is not None and lock.arrival)

    async def erase(self, object_key: str, *, moved_to: str = "", move_id: str = "") -> bool:
        """Removes the object for good, recording nothing: the key's next write creates a new
        object. Refused with a destination (an erased object goes nowhere), and for an object
        moved away or being moved (`admit`). True if it existed. With `move_id`, drops the copy
        a failed move's import holds here (`_drop_arrival`)."""
        keys.check_object_key(object_key, max_bytes=self._max_object_key_bytes)
        if moved_to:
            raise InvalidArgument("an erased object goes nowhere: leave moved_to empty", field="moved_to")
        async with self._changes_of(object_key):
            if move_id:
                return await self._drop_arrival(object_key, move_id)
            return await self._erase(object_key)

    async def _erase(self, object_key: str) -> bool:
        self.admit(object_key, writing=True)
        self._aborted.discard(object_key)
        # An expired lock: no move can end in a delete now.
        lock = self._moving.get(object_key)
        await self._forget_departure(object_key, lock)
        if self._moving.get(object_key) is lock:
            self._moving.pop(object_key, None)
        return await _run_to_end(self._ending_exports(object_key, self._remove_files(object_key)))

    async def _ending_exports(self, object_key: str, removal: Awaitable[bool]) -> bool:
        """`removal` of the object's files, then the end of its exports under way (`_ExportCut`),
        before the erase returns: an erase that fails ends none, the object being still there."""
        existed = await removal
        for export in self._exports.get(object_key, ()):
            export.erased = True
        return existed

    async def _drop_arrival(self, object_key: str, move_id: str) -> bool:
        """Removes the copy a move's import installed and holds (`receive` with hold_for_move),
        while that hold holds: the move failed, and its source takes writes again. A key that
        had been moved away from here before the import is refused again as it was."""
        self.admit(object_key, writing=False)
        lock = self._moving.get(object_key)
        if lock is None or not lock.arrival or lock.id != move_id:
            raise FailedPrecondition(
                "the import hold this erase names no longer holds here (released by AbortMove, or replaced "
                "by another import's): the copy may have taken writes, so nothing was erased",
                reason="FAILED_PRECONDITION",
            )
        if lock.kept is not None:  # the object the import replaced comes back
            removal = self._put_back(object_key, lock.kept)
        elif lock.moved_before is not None:  # refused again (recorded first), files gone, hold ended
            removal = self._remove(object_key, lock.moved_before, lock.moved_before_lock)
        else:
            removal = self._remove_files(object_key)
        existed = await _run_to_end(self._ending_exports(object_key, removal))
        await self._change_holds(object_key, "ending the import's hold", self._arrivals.end)
        if self._moving.get(object_key) is lock:
            del self._moving[object_key]
        self._remove_kept(lock.kept)
        return existed

    async def _put_back(self, object_key: str, kept: str) -> bool:
        """Installs the copy kept of the object a held import replaced, over that import's copy."""
        async with self._registry.closed(object_key):
            try:
                await _finish_in_thread(self._install_kept, object_key, kept)
            except (OSError, StorageError, files.StoreImportError) as exc:
                self.note_storage_failure(object_key, "putting back the replaced object", str(exc))
                raise storage_failure(
                    f"the object the import replaced could not be put back, nothing was dropped: "
                    f"{self.without_paths(str(exc))}",
                    out_of_space=is_out_of_space(exc),
                ) from None
            self._registry.forget_damage(object_key)
        return True

    async def delete(self, object_key: str, *, moved_to: str, move_id: str = "") -> bool:
        """Removes the object; later calls are refused, naming `moved_to`. A move's last step:
        refused for an object not stored here (unless a repeat of the move's delete), and without
        a move lock or a destination (most likely an erase that forgot `erase`), since the key
        would be refused from then on. With `move_id`, only while that lock holds."""
        keys.check_object_key(object_key, max_bytes=self._max_object_key_bytes)
        # Kept for good (MOVED, read at every start) and quoted in every refusal: an address.
        check_size(moved_to, MAX_MOVED_TO_BYTES, "moved_to", "max_moved_to_bytes", "moved_to")
        async with self._changes_of(object_key):
            return await self._delete(object_key, moved_to, move_id)

    async def _delete(self, object_key: str, moved_to: str, move_id: str) -> bool:
        if self._placement is not None:
            self._placement.check(object_key)
        lock = self._moving.get(object_key)
        if lock is not None and lock.arrival:
            raise FailedPrecondition(
                "the object is arriving here (a move's import holds it): its mover releases it (AbortMove) or "
                "drops it (DeleteObject with erase and its move_id); nothing was deleted",
                reason="FAILED_PRECONDITION",
            )
        if object_key in self._moved:
            return await _run_to_end(self._remove_again(object_key, moved_to, move_id))
        if not self.is_stored(object_key):
            raise NotFound(
                "no object under this key on this server: nothing was deleted or recorded", field="object_key"
            )
        if lock is None and not moved_to:
            raise FailedPrecondition(
                "a delete without erase ends a move, and this server refuses the key from then on: "
                "export the object with lock_for_move first or name its destination in moved_to; "
                "set erase to delete it for good",
                reason="FAILED_PRECONDITION",
            )
        if move_id and (lock is None or lock.id != move_id):
            raise FailedPrecondition(
                "the move lock this delete names no longer holds (released by AbortMove, taken over by "
                "another export, or its lease ran out before this server restarted): writes may have been "
                "accepted after the snapshot, so nothing was deleted; move the object again",
                reason="FAILED_PRECONDITION",
            )
        expiry = math.inf
        if lock is not None:  # the end of a move: the lock must still hold
            expiry = lock.expiry
            if time.monotonic() >= expiry:
                raise FailedPrecondition(
                    "the move lock expired before this delete: writes may have been accepted after "
                    "the snapshot, so nothing was deleted; export the object again (or AbortMove, "
                    "then delete)",
                    reason="FAILED_PRECONDITION",
                )
            lock.expiry = math.inf  # held until the file is gone
        elif object_key in self._aborted:
            # The mover may not know (another operator released the lock): writes accepted since
            # then are not in the copy it made.
            raise FailedPrecondition(
                "the move lock was released (AbortMove) while the move was under way: writes may have been "
                "accepted after the snapshot, so nothing was deleted; export the object again (or call "
                "AbortMove once more, then delete)",
                reason="FAILED_PRECONDITION",
            )
        # Run to its end even if the mover gives up meanwhile (the close may wait for stuck
        # calls): once recorded, the object is refused here, and its file must go too.
        try:
            return await _run_to_end(self._remove(object_key, moved_to, "" if lock is None else lock.id))
        except BaseException:
            if lock is not None and self._moving.get(object_key) is lock:
                lock.expiry = expiry  # nothing was deleted: the lease runs on as it was
            raise

    async def _remove_again(self, object_key: str, moved_to: str, move_id: str) -> bool:
        """A move's delete asked again (its answer lost, say), its lock gone with the first: the
        destination recorded then stands, and what files a delete cut short left go. One naming
        another move's lock, or another destination, is refused and records nothing: a mover
        that stalled while its lock was released and the object moved again must not take the
        object as moved to its copy."""
        if not self._moved.is_recorded(object_key):  # its record is being written: it may yet fail
            raise Unavailable("a delete of this object is under way here; ask again shortly", reason="OBJECT_MOVING")
        recorded = self._moved.where(object_key) or ""
        ended = self._moved.move_id(object_key)
        if move_id and ended and move_id != ended:
            raise FailedPrecondition(
                "the move lock this delete names no longer holds: another move took the object "
                f"to {recorded or 'another server'} since, and its copy is the one that takes writes; "
                "nothing was deleted or recorded",
                reason="FAILED_PRECONDITION",
            )
        if moved_to and moved_to != recorded:
            raise FailedPrecondition(
                f"the object was moved from this server to {recorded or 'another server'} already, and a delete "
                f"naming {moved_to} records nothing: delete it where it went, or import it here again first",
                reason="OBJECT_NOT_OWNED",
                owner=recorded,
            )
        return await self._clear_away(object_key)

    async def _remove(self, object_key: str, moved_to: str, move_id: str) -> bool:
        # Refused from now on (calls waiting for the object check again after their wait), and
        # recorded durably before the file goes, so that a restart refuses it too.
        before = self._moved.where(object_key)
        self._moved.refuse(object_key, moved_to)
        try:
            await asyncio.to_thread(self._moved.record, object_key, moved_to, move_id)
        except OSError as exc:
            self._moved.refuse(object_key, before)
            self.note_storage_failure(object_key, "recording the move", str(exc))
            raise storage_failure(
                f"the move could not be recorded, nothing was deleted: {self.without_paths(str(exc))}",
                out_of_space=is_out_of_space(exc),
            ) from None
        return await self._clear_away(object_key)

    async def _clear_away(self, object_key: str) -> bool:
        """Removes the files of an object recorded as moved away, then its lock and the record's
        note that files may be left. Whether there were files."""
        settled = True
        try:
            existed = await self._remove_files(object_key)
        except Exception:
            # The key is refused for good already (recorded): the delete took effect, and
            # answering it as failed would have its mover drop the destination's copy, the only
            # one served. The record's note stays: the next start sets the files aside.
            log.exception(
                "%r: moved away, but its files could not be removed: the next start sets them aside", object_key
            )
            existed, settled = True, False
        # A restart drops a lock whose key is recorded as moved: the delete is done either way,
        # and answering it as failed would have its mover drop the only copy left.
        with contextlib.suppress(SessionsError):
            await self._forget_departure(object_key, self._moving.pop(object_key, None))
        if settled:
            with contextlib.suppress(OSError):  # the files are gone all the same; a start looks once more
                await asyncio.to_thread(self._moved.settle, [object_key])
        return existed

    async def _remove_files(self, object_key: str) -> bool:
        async with self._registry.closed(object_key):  # its subscriptions end, its calls wait
            path = object_path(self.data_dir, object_key)
            try:
                existed = await asyncio.to_thread(
                    files.remove_object_files, path, self.data_dir / datadir.SCRATCH_DIR_NAME, prune=True
                )
            except OSError as exc:  # the disk or the directory's permissions: not the caller's doing
                self.note_storage_failure(object_key, "removing the object's files", str(exc))
                raise storage_failure(
                    f"the object's files could not be removed ({self.without_paths(str(exc))}): it may be gone "
                    "already, or still there; ask again once the server's disk is fixed",
                    out_of_space=is_out_of_space(exc),
                ) from None
            self._registry.forget_damage(object_key)  # its file is gone, damaged or not
            return existed


async def _finish_in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a worker thread, awaited to its end even if the caller is
    cancelled meanwhile: what it does to the files cannot be taken back, and the lock or
    `closed` block the caller holds must cover all of it."""
    return await _run_to_end(asyncio.to_thread(fn, *args, **kwargs))


async def _run_to_end(work: Awaitable[T]) -> T:
    """Awaits `work` to its end even if the caller is cancelled meanwhile; a cancelled caller is
    cancelled once it is done."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the caller is cancelled, whatever the work ended with
        raise asyncio.CancelledError
    return task.result()


def _remove_copy(made: asyncio.Future[Path]) -> None:
    if not made.cancelled() and made.exception() is None:
        made.result().unlink(missing_ok=True)


def _lease(lease_seconds: int) -> float:
    """A move lock's lease in seconds, as a request gives it (0: the default)."""
    if not 0 <= lease_seconds <= MAX_LEASE_SECONDS:
        raise InvalidArgument(
            f"lease_seconds must be from 0 (for {DEFAULT_LEASE_SECONDS} s) to {MAX_LEASE_SECONDS}, not {lease_seconds}",
            field="lease_seconds",
        )
    return lease_seconds or DEFAULT_LEASE_SECONDS


def _lock_lost_mid_export() -> FailedPrecondition:
    return FailedPrecondition(
        "the move lock this export took was released (AbortMove), taken over by another export or ran out "
        "while the object was sent: the copy may miss writes taken since, so the export is cut short and "
        "nothing can be moved with it; move the object again",
        reason="FAILED_PRECONDITION",
    )


def _already_here() -> FailedPrecondition:
    return FailedPrecondition("the object already exists here (set replace)", reason="OBJECT_EXISTS")


def _moving_away_from_here() -> FailedPrecondition:
    return FailedPrecondition(
        "this server is moving the object away (a move under way here holds its lock), so it takes no copy "
        "of it meanwhile: a move's destination must be another server than its source, whichever address "
        "names it",
        reason="OBJECT_DEPARTING",
    )
