"""Damaged and foreign object files (storage/registry.py, storage/store.py, storage/schema.py).

When SQLite reports an object's file corrupt or not a database, on open, a read or a write, the
call is refused with ObjectDamaged and the object is quarantined by key in the registry: every
later call is refused the same way without touching the file, also after its store closed, until
the file is erased or replaced (`forget_damage`). A write in flight when the damage is found is
not committed. A SQLite file of another program at an object's path is refused the same way and
left byte for byte as it was; an empty file, and upstream's, open as before."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.storage import rows, schema
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import NewRow, ObjectDamaged, Parent, StorageError
from sessions_server.storage.store import ObjectStore, WriteContext, append_in
from tests.storage.upstream_schema import write_upstream_store

KEY = "damaged-object"
ROWS = 300
PAGE = schema.NEW_FILE_PAGE_SIZE


@contextlib.asynccontextmanager
async def registry(data_dir: Path) -> AsyncIterator[ObjectRegistry]:
    executor = ThreadPoolExecutor(max_workers=2)
    objects = ObjectRegistry(data_dir, executor)
    try:
        yield objects
    finally:
        await objects.close_all()
        executor.shutdown()


def _row(message_id: str, text: str) -> NewRow:
    content = f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{text}"}}]}}'
    return NewRow(id=message_id, role="user", slices=[content], digest="", token_estimate=len(text) // 4)


def _append(message_id: str, text: str = "hello") -> Callable[[WriteContext], Any]:
    return lambda ctx: append_in(ctx, "", _row(message_id, text), Parent.auto(), lambda _: True)


def _note(body: str) -> Callable[[WriteContext], None]:
    def run(ctx: WriteContext) -> None:
        ctx.conn.execute("INSERT OR REPLACE INTO _cf_KV (key, value) VALUES (?, ?)", (f"note:{body}", body))

    return run


def _all_contents(conn: sqlite3.Connection) -> int:
    """Reads every message's content (every page of the messages table)."""
    return sum(len(row[0]) for row in conn.execute("SELECT content FROM cf_agents_session_messages"))


def _count(conn: sqlite3.Connection) -> int:
    """Rows of a small table (its pages are not among those damaged)."""
    return int(conn.execute("SELECT COUNT(*) FROM _cf_KV").fetchone()[0])


def _notes(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM _cf_KV WHERE key LIKE 'note:%'").fetchone()[0])


def _messages(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM cf_agents_session_messages").fetchone()[0])


async def _written(data_dir: Path, rows: int) -> Path:
    """The object with `rows` messages of about 1.5 KB, then closed (its WAL checkpointed away)."""
    async with registry(data_dir) as objects, objects.use(KEY) as store:
        for index in range(rows):
            await store.write(_append(f"m{index}", f"alpha beta {index} " + "z" * 1500))
    return object_path(data_dir, KEY)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corrupt_interior_pages(path: Path) -> None:
    """Overwrites the middle of every other page in the second half of the file: the messages'
    pages (the tables' root pages, written first, are left alone), so the file opens and a read
    of the messages meets the damage."""
    pages = path.stat().st_size // PAGE
    assert pages > 20
    with path.open("r+b") as file:
        for page in range(pages // 2, pages, 2):
            file.seek(page * PAGE + 200)
            file.write(b"\xff" * (PAGE // 2))  # random bytes now and then read as a too-long string


# ── damaged on open ─────────────────────────────────────────────────────────


def _garbage_header(path: Path) -> None:
    with path.open("r+b") as file:
        file.write(os.urandom(100))


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"this is a text file, not sqlite\n" * 100)


def _header_only(path: Path) -> None:
    with path.open("r+b") as file:
        file.truncate(100)


@pytest.mark.parametrize(
    "damage", [_garbage_header, _not_sqlite, _header_only], ids=["garbage header", "not sqlite", "header only"]
)
def test_a_file_damaged_so_it_cannot_open_is_quarantined_and_left_unchanged(
    tmp_path: Path, damage: Callable[[Path], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = asyncio.run(_written(tmp_path, 5))
    damage(path)
    before = _digest(path)
    opens: list[str] = []
    open_ready = ObjectStore.open_ready

    def counted(*args: Any, **options: Any) -> ObjectStore | None:
        opens.append(args[0])
        return open_ready(*args, **options)

    monkeypatch.setattr(ObjectStore, "open_ready", staticmethod(counted))

    async def scenario() -> list[BaseException]:
        failures: list[BaseException] = []
        async with registry(tmp_path) as objects:
            for _ in range(3):
                try:
                    async with objects.use(KEY) as store:
                        await store.write(_note("never"))
                except StorageError as exc:
                    failures.append(exc)
            try:
                async with objects.use_existing(KEY):
                    pass
            except StorageError as exc:
                failures.append(exc)
            assert objects.damage(KEY) is not None
            assert objects.open_count == 0
        return failures

    failures = asyncio.run(scenario())
    assert len(failures) == 4
    assert all(isinstance(exc, ObjectDamaged) and not exc.foreign for exc in failures)
    assert opens == [KEY]  # the later calls touched nothing
    assert _digest(path) == before


# ── damaged inside: found by a read ─────────────────────────────────────────


def test_damage_a_read_finds_refuses_every_later_read_and_write_and_outlives_the_store(tmp_path: Path) -> None:
    path = asyncio.run(_written(tmp_path, ROWS))
    _corrupt_interior_pages(path)
    before = _digest(path)

    async def scenario() -> tuple[list[BaseException], int]:
        refused: list[BaseException] = []
        async with registry(tmp_path) as objects:
            async with objects.use(KEY) as store:
                notes_before = await store.read(_count)  # the file opens, and its small tables read
                with pytest.raises(ObjectDamaged) as found:
                    await store.read(_all_contents)
                assert "malformed" in str(found.value)
                assert store.damaged is not None
                for attempt in (
                    store.write(_append("new")),
                    store.write(_note("after")),
                    store.read(_count),
                ):
                    try:
                        await attempt
                    except StorageError as exc:
                        refused.append(exc)
            await objects.close_object(KEY)  # waits for the close its last call's release began
            assert not objects.is_open(KEY)
            for _ in range(2):  # reopened? no: the registry refuses the key itself
                try:
                    async with objects.use(KEY) as store:
                        await store.write(_note("later"))
                except StorageError as exc:
                    refused.append(exc)
        return refused, notes_before

    refused, notes_before = asyncio.run(scenario())
    assert notes_before >= 1
    assert len(refused) == 5
    assert all(isinstance(exc, ObjectDamaged) for exc in refused)
    assert _digest(path) == before


def test_the_close_of_a_damaged_object_leaves_its_file_and_wal_as_they_are(tmp_path: Path) -> None:
    """SQLite checkpoints the WAL into the file as the last connection to it closes: the close
    of a damaged object's store would write its committed frames into the damaged file (and
    remove the WAL), after the damage was found and before the operator could copy either."""
    path = asyncio.run(_written(tmp_path, ROWS))
    _corrupt_interior_pages(path)
    before = _digest(path)
    wal = Path(f"{path}-wal")

    async def scenario() -> int:
        async with registry(tmp_path) as objects:
            async with objects.use(KEY) as store:
                await store.write(_note("in the WAL only"))  # a small table's page, not damaged
                with pytest.raises(ObjectDamaged):
                    await store.read(_all_contents)
            wal_then = wal.stat().st_size
            await objects.close_object(KEY)
            assert not objects.is_open(KEY)
        return wal_then

    wal_then = asyncio.run(scenario())
    assert _digest(path) == before
    assert wal.exists() and wal.stat().st_size == wal_then > 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        assert _notes(conn) == 1  # the committed note is still there, in the WAL


def test_a_read_still_running_when_a_damaged_object_closes_leaves_its_file_and_wal_too(tmp_path: Path) -> None:
    """A read whose caller left (its deadline) goes on on its thread; the object, idle, closes;
    the read's own connection, closed after, was the file's last and checkpointed it."""
    path = asyncio.run(_written(tmp_path, ROWS))
    _corrupt_interior_pages(path)
    before = _digest(path)
    wal = Path(f"{path}-wal")
    started, release = threading.Event(), threading.Event()

    def held_read(conn: sqlite3.Connection) -> int:
        conn.execute("SELECT COUNT(*) FROM _cf_KV").fetchone()
        started.set()
        release.wait(60)
        return 1

    async def scenario() -> int:
        async with registry(tmp_path) as objects:
            async with objects.use(KEY) as store:
                await store.write(_note("in the WAL only"))

            async def call() -> int:
                async with objects.use(KEY) as store:
                    return await store.read(held_read)

            left = asyncio.ensure_future(call())
            assert await asyncio.to_thread(started.wait, 60)
            left.cancel()  # its read goes on on its thread
            with contextlib.suppress(asyncio.CancelledError):
                await left
            async with objects.use(KEY) as store:
                with pytest.raises(ObjectDamaged):
                    await store.read(_all_contents)
            wal_then = wal.stat().st_size
            await objects.close_object(KEY)
            release.set()
        return wal_then  # the registry's executor has shut down: the read has ended

    wal_then = asyncio.run(scenario())
    assert _digest(path) == before
    assert wal.exists() and wal.stat().st_size == wal_then > 0


def test_a_rewrite_queued_when_damage_is_found_writes_nothing(tmp_path: Path) -> None:
    path = asyncio.run(_written(tmp_path, ROWS))
    _corrupt_interior_pages(path)
    wal = Path(f"{path}-wal")
    started, release = threading.Event(), threading.Event()

    def held_write(ctx: WriteContext) -> None:
        started.set()
        release.wait(60)

    async def scenario() -> tuple[int, int, BaseException | None]:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(_note("first"))
            held = asyncio.ensure_future(store.write(held_write))
            assert await asyncio.to_thread(started.wait, 60)
            rewrite = asyncio.ensure_future(store.rewrite_compactly(tmp_path / "scratch", contextlib.nullcontext))
            with pytest.raises(ObjectDamaged):
                await store.read(_all_contents)  # found while the rewrite waits for the writer
            frames_then = wal.stat().st_size
            release.set()
            await asyncio.gather(held, return_exceptions=True)
            outcome = (await asyncio.gather(rewrite, return_exceptions=True))[0]
            return frames_then, wal.stat().st_size, outcome if isinstance(outcome, BaseException) else None

    frames_then, frames_after, outcome = asyncio.run(scenario())
    assert isinstance(outcome, ObjectDamaged)
    assert frames_after == frames_then


def test_a_wal_trim_decided_before_damage_was_found_writes_nothing(tmp_path: Path) -> None:
    path = asyncio.run(_written(tmp_path, ROWS))
    _corrupt_interior_pages(path)
    before = _digest(path)
    wal = Path(f"{path}-wal")

    async def scenario() -> tuple[int, int]:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            for index in range(12):  # a WAL past the size a quiet object's trim empties
                await store.write(_note(f"{index}" + "n" * 200_000))
            assert not store.sweep_wal(start=False)  # the first look: written since any before it
            assert store.sweep_wal(start=False)  # quiet: due, not yet started
            with pytest.raises(ObjectDamaged):
                await store.read(_all_contents)
            frames_then = wal.stat().st_size
            store.start_wal_trim()
            await store.settled()
            return frames_then, wal.stat().st_size

    frames_then, frames_after = asyncio.run(scenario())
    assert frames_then >= 1024 * 1024
    assert frames_after == frames_then
    assert _digest(path) == before


def test_a_write_that_meets_damage_is_not_committed_nor_are_the_jobs_grouped_with_it(tmp_path: Path) -> None:
    """Jobs queued together commit in one transaction: when one of them meets the damage, none
    of the group is committed or answered as written, and the writes after it are refused
    without touching the file."""
    path = asyncio.run(_written(tmp_path, ROWS))
    _corrupt_interior_pages(path)
    before = _digest(path)

    def scan_then_note(ctx: WriteContext) -> None:
        _all_contents(ctx.conn)
        _note("scanned")(ctx)

    async def scenario() -> list[Any]:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.read(_count)  # opened; the next writes queue together on the writer
            outcomes = await asyncio.gather(
                store.write(_note("first")),
                store.write(scan_then_note),
                store.write(_note("third")),
                return_exceptions=True,
            )
            outcomes.append(await asyncio.gather(store.write(_note("later")), return_exceptions=True))
            notes = await asyncio.gather(store.read(_count), return_exceptions=True)
            return [*outcomes, notes]

    first, scanning, third, (later,), (read,) = asyncio.run(scenario())
    for outcome in (first, scanning, third, later, read):
        assert isinstance(outcome, ObjectDamaged), outcome
    assert _digest(path) == before
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        assert _notes(conn) == 0


def test_an_erased_or_replaced_damaged_object_opens_afresh(tmp_path: Path) -> None:
    path = asyncio.run(_written(tmp_path, 5))
    _garbage_header(path)

    async def scenario() -> tuple[int, int]:
        async with registry(tmp_path) as objects:
            with pytest.raises(ObjectDamaged):
                async with objects.use(KEY):
                    pass
            # Replaced (ImportObject's install, through `closed`): the key is served again.
            async with objects.closed(KEY):
                path.unlink()
                _upstream_store(path)
                objects.forget_damage(KEY)
            async with objects.use(KEY) as store:
                replaced = await store.read(_messages)
            async with objects.closed(KEY):
                _garbage_header(path)
            with pytest.raises(ObjectDamaged):
                async with objects.use_existing(KEY):
                    pass
            # Removed by hand: the key starts afresh, as after an erase.
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            async with objects.use_existing(KEY) as absent:
                assert absent is None
            async with objects.use(KEY) as store:
                await store.write(_note("fresh"))
                fresh = await store.read(_notes)
            return replaced, fresh

    assert asyncio.run(scenario()) == (1, 1)


# ── another program's database ──────────────────────────────────────────────


def _foreign(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE foo (a, b)")
        conn.execute("INSERT INTO foo VALUES (1, 2)")
        conn.commit()


def test_another_programs_database_is_refused_and_left_byte_for_byte(tmp_path: Path) -> None:
    path = object_path(tmp_path, KEY)
    _foreign(path)
    before = _digest(path)

    async def scenario() -> list[BaseException]:
        failures: list[BaseException] = []
        async with registry(tmp_path) as objects:
            for opened in (objects.use, objects.use_existing, objects.use):
                try:
                    async with opened(KEY):
                        pass
                except StorageError as exc:
                    failures.append(exc)
        return failures

    failures = asyncio.run(scenario())
    assert len(failures) == 3
    assert all(isinstance(exc, ObjectDamaged) and exc.foreign for exc in failures)
    assert "not a Sessions object file" in str(failures[0])
    assert _digest(path) == before
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        assert {row[0] for row in conn.execute("SELECT name FROM sqlite_master")} == {"foo"}


def _empty_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def _schemaless_database(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 7")  # a database file with no schema


def _agent_database(path: Path) -> None:
    """A Durable Object's database as an agent leaves it before any session: upstream's own
    tables beside the agent's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE cf_agents_state (id TEXT PRIMARY KEY, state TEXT)")
        conn.execute("CREATE TABLE my_agent_notes (note TEXT)")
        conn.commit()


def _upstream_store(path: Path) -> None:
    write_upstream_store(path, [("", "u1", 1, None, "user", '{"id":"u1","role":"user","parts":[]}', 1)])


@pytest.mark.parametrize(
    "make",
    [_empty_file, _schemaless_database, _agent_database, _upstream_store],
    ids=["0 bytes", "no schema", "an agent's database", "upstream's store"],
)
def test_empty_files_and_upstreams_open_as_objects(tmp_path: Path, make: Callable[[Path], None]) -> None:
    path = object_path(tmp_path, KEY)
    make(path)

    async def scenario() -> int:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(_note("taken"))
            return await store.read(_notes)

    assert asyncio.run(scenario()) == 1
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT value FROM _sessions_meta WHERE key = 'object_key'").fetchone() == (KEY,)


def test_the_schema_check_names_what_is_foreign() -> None:
    assert schema.is_foreign({"foo"})
    assert schema.is_foreign({"foo", "sqlite_sequence", "sqlite_autoindex_foo_1"})
    assert not schema.is_foreign(set())
    assert not schema.is_foreign({"sqlite_sequence"})
    assert not schema.is_foreign({"_cf_KV"})
    assert not schema.is_foreign({"assistant_messages", "foo"})
    assert not schema.is_foreign({"_sessions_meta"})


def test_damage_a_replaced_objects_old_store_finds_quarantines_nothing(tmp_path: Path) -> None:
    """A read of the old file that outlives an erase or a replacement may still meet its damage:
    the key, healthy now, must not be refused for it, by the registry or by whoever answers the
    call (`judged` tells them the registry has seen it)."""
    registry = ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=1))
    old_store: Any = object()  # no longer the key's: closed for the replacement
    damage = ObjectDamaged("database disk image is malformed", operation="read")
    registry._quarantine_from("replaced", old_store, damage)
    assert registry.damage("replaced") is None
    assert damage.judged and damage.again("read").judged
    found_elsewhere = ObjectDamaged("file is not a database", operation="export copy")
    assert not found_elsewhere.judged  # an export's copy: its answerer quarantines the key
    registry.quarantine("copied", found_elsewhere)
    assert registry.damage("copied") is found_elsewhere and found_elsewhere.judged


@pytest.mark.parametrize("read_only_mount", [False, True], ids=["owner or mode", "read-only file system"])
def test_a_file_refused_for_its_mode_is_a_permission_problem_and_on_a_read_only_mount_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only_mount: bool
) -> None:
    """An operator told to fix the owner or mode of a file on a file system remounted read-only
    (after disk errors, say) would look in vain. The tests run as root, whom modes do not stop:
    the refusal is what `os.access` answers."""
    path = tmp_path / "object.sqlite"
    path.write_bytes(b"")
    refused = sqlite3.OperationalError("attempt to write a readonly database")
    refused.sqlite_errorcode = sqlite3.SQLITE_READONLY  # type: ignore[attr-defined]
    flags = os.ST_RDONLY if read_only_mount else 0
    monkeypatch.setattr(rows.os, "access", lambda *_: False)
    monkeypatch.setattr(rows.os, "statvfs", lambda _: os.statvfs_result((0,) * 8 + (flags, 255)))
    assert rows.permission_denied_on(path, refused) is not read_only_mount
