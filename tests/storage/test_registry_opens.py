"""Where an object opens (storage/registry.py `ObjectRegistry._open_store`).

A file this service opened before opens on the calling thread (the event loop's) when the
server is quiet and such opens have been quick: a cold object's first request then pays no
thread hop. A missing file, one that needs its schema created or upgraded, one not in WAL mode,
one with a large WAL, a locked file, and every open while other calls are in flight go to the
executor."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sessions_server.storage import registry as registry_module
from sessions_server.storage import schema
from sessions_server.storage import store as store_module
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.store import ObjectStore, WriteContext
from tests.storage.upstream_schema import write_upstream_store

KEY = "opened-object"


@pytest.fixture(autouse=True)
def any_open_is_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """However slowly this machine opens files, these tests count it as quick (one test below
    restores the real limit to show what a slow open does)."""
    monkeypatch.setattr(registry_module, "INLINE_OPEN_MAX_SECONDS", 60.0)


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Every open as (kind, ran on the test's thread): 'ready' for `ObjectStore.open_ready`
    (None answers are recorded as 'not ready'), 'full' for `ObjectStore.open`."""
    calls: list[tuple[str, bool]] = []
    test_thread = threading.get_ident()
    open_ready, open_full = ObjectStore.open_ready, ObjectStore.open

    def recording_ready(*args: Any, **options: Any) -> ObjectStore | None:
        store = open_ready(*args, **options)
        calls.append(("ready" if store is not None else "not ready", threading.get_ident() == test_thread))
        return store

    def recording_full(*args: Any, **options: Any) -> ObjectStore:
        calls.append(("full", threading.get_ident() == test_thread))
        return open_full(*args, **options)

    monkeypatch.setattr(ObjectStore, "open_ready", staticmethod(recording_ready))
    monkeypatch.setattr(ObjectStore, "open", staticmethod(recording_full))
    return calls


@asynccontextmanager
async def registry(
    data_dir: Path, calls_in_flight: Callable[[], int] | None, max_open: int = registry_module.DEFAULT_MAX_OPEN_OBJECTS
) -> AsyncIterator[ObjectRegistry]:
    executor = ThreadPoolExecutor(max_workers=2)
    objects = ObjectRegistry(data_dir, executor, calls_in_flight=calls_in_flight, max_open=max_open)
    try:
        yield objects
    finally:
        await objects.close_all()
        executor.shutdown()


def add_note(body: str) -> Callable[[WriteContext], None]:
    def run(ctx: WriteContext) -> None:
        ctx.conn.execute("INSERT OR REPLACE INTO _cf_KV (key, value) VALUES (?, ?)", (f"note:{body}", body))

    return run


def read_notes(conn: sqlite3.Connection) -> list[str]:
    return [str(row[0]) for row in conn.execute("SELECT value FROM _cf_KV WHERE key LIKE 'note:%' ORDER BY key")]


async def written_and_closed(data_dir: Path, *bodies: str) -> None:
    """The object, created with these notes, then closed (as the LRU closes an idle object)."""
    async with registry(data_dir, None) as objects, objects.use(KEY) as store:
        for body in bodies:
            await store.write(add_note(body))


def test_a_lone_callers_object_opens_in_place_and_works(tmp_path: Path, opens: list[tuple[str, bool]]) -> None:
    async def scenario() -> tuple[list[str], list[str], int]:
        await written_and_closed(tmp_path, "a")
        opens.clear()
        async with registry(tmp_path, lambda: 1) as objects:
            async with objects.use(KEY) as store:
                before = await store.read(read_notes, quick=True)
                await store.write(add_note("b"), size_hint=100)
                await store.write(add_note("c"))  # on the writer thread, which waits for locks again
                after = await store.read(read_notes)
            return before, after, objects.inline_opens

    before, after, inline_opens = asyncio.run(scenario())
    assert opens == [("ready", True)]
    assert inline_opens == 1
    assert (before, after) == (["a"], ["a", "b", "c"])


@pytest.mark.parametrize(
    "calls",
    [lambda: 2, None],
    ids=["another call in flight", "no call count"],
)
def test_other_opens_run_on_the_executor(
    tmp_path: Path, opens: list[tuple[str, bool]], calls: Callable[[], int] | None
) -> None:
    async def scenario() -> tuple[list[str], int]:
        await written_and_closed(tmp_path, "a")
        opens.clear()
        async with registry(tmp_path, calls) as objects, objects.use(KEY) as store:
            return await store.read(read_notes), objects.inline_opens

    notes, inline_opens = asyncio.run(scenario())
    assert opens == [("ready", False)]
    assert (notes, inline_opens) == (["a"], 0)


def test_a_new_object_is_created_on_the_executor(tmp_path: Path, opens: list[tuple[str, bool]]) -> None:
    async def scenario() -> tuple[list[str], int]:
        async with registry(tmp_path, lambda: 1) as objects, objects.use(KEY) as store:
            await store.write(add_note("first"))
            return await store.read(read_notes, quick=True), objects.inline_opens

    notes, inline_opens = asyncio.run(scenario())
    assert opens == [("not ready", True), ("full", False)]
    assert (notes, inline_opens) == (["first"], 0)
    assert object_path(tmp_path, KEY).exists()


def test_a_file_that_needs_upgrading_is_upgraded_on_the_executor(tmp_path: Path, opens: list[tuple[str, bool]]) -> None:
    """An upstream-written file lacks this service's additions: checking it in place writes
    nothing, and the upgrade runs on the executor."""
    path = object_path(tmp_path, KEY)
    write_upstream_store(path, [("", "m1", 1, None, "user", '{"id":"m1","role":"user","parts":[]}', 1)])
    upstream_tables = tables(path)

    async def scenario() -> tuple[set[str], list[str], int]:
        async with registry(tmp_path, lambda: 1) as objects, objects.use(KEY) as store:
            return tables(path), await store.read(message_ids), objects.inline_opens

    after_open, ids, inline_opens = asyncio.run(scenario())
    assert opens == [("not ready", True), ("full", False)]
    assert (ids, inline_opens) == (["m1"], 0)
    assert "_sessions_meta" not in upstream_tables
    assert after_open == upstream_tables | {
        "_sessions_meta",
        "_sessions_messages_by_seq",
        "_sessions_messages_by_parent",
        "_sessions_attachment_refs_by_hash",
    }


def test_a_file_in_rollback_journal_mode_is_switched_to_wal_on_the_executor(
    tmp_path: Path, opens: list[tuple[str, bool]]
) -> None:
    """A copy of an object (an import, a restore) may come in another journal mode; switching it
    to WAL writes the file, so that open is not one for the event loop's thread."""
    path = object_path(tmp_path, KEY)

    async def scenario() -> list[str]:
        await written_and_closed(tmp_path, "a")
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode = DELETE")
        opens.clear()
        async with registry(tmp_path, lambda: 1) as objects, objects.use(KEY) as store:
            return await store.read(read_notes, quick=True)

    assert asyncio.run(scenario()) == ["a"]
    assert opens == [("not ready", True), ("full", False)]
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_file_with_a_large_wal_opens_on_the_executor(tmp_path: Path, opens: list[tuple[str, bool]]) -> None:
    """After a crash the first open recovers the WAL, reading all of it: a WAL over
    READY_OPEN_MAX_WAL_BYTES is left to the executor. (Here another connection keeps the WAL
    from being checkpointed away.)"""
    path = object_path(tmp_path, KEY)
    asyncio.run(written_and_closed(tmp_path, "a"))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("PRAGMA wal_autocheckpoint = 0")
        big = "x" * (store_module.READY_OPEN_MAX_WAL_BYTES + 1)
        other.execute("INSERT INTO _cf_KV (key, value) VALUES ('note:big', ?)", (big,))
        assert Path(f"{path}-wal").stat().st_size > store_module.READY_OPEN_MAX_WAL_BYTES
        opens.clear()

        async def scenario() -> list[str]:
            async with registry(tmp_path, lambda: 1) as objects, objects.use(KEY) as store:
                return await store.read(read_notes, quick=True)

        notes = asyncio.run(scenario())
    finally:
        other.close()
    assert [note[:1] for note in notes] == ["a", "x"]
    assert opens == [("not ready", True), ("full", False)]


def message_ids(conn: sqlite3.Connection) -> list[str]:
    return [str(row[0]) for row in conn.execute("SELECT id FROM cf_agents_session_messages")]


def tables(path: Path) -> set[str]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master")}


def test_a_locked_file_never_blocks_the_event_loop(tmp_path: Path, opens: list[tuple[str, bool]]) -> None:
    """Another connection holding the file exclusively makes the open in place give up at once;
    the open on the executor waits for the lock as usual (here the holder lets go as it begins)."""
    path = object_path(tmp_path, KEY)
    asyncio.run(written_and_closed(tmp_path, "a"))
    opens.clear()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT OR REPLACE INTO _cf_KV (key, value) VALUES ('note:held', 'held')")
    full_open = ObjectStore.open
    let_go_at: list[float] = []

    def open_after_letting_go(*args: Any, **options: Any) -> ObjectStore:
        holder.execute("COMMIT")
        holder.close()
        let_go_at.append(time.perf_counter())
        return full_open(*args, **options)

    async def scenario() -> tuple[list[str], float]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ObjectStore, "open", staticmethod(open_after_letting_go))
            async with registry(tmp_path, lambda: 1) as objects:
                started = time.perf_counter()
                async with objects.use(KEY) as store:
                    return await store.read(read_notes), started

    notes, started = asyncio.run(scenario())
    assert [kind for kind, _ in opens] == ["not ready", "full"]
    assert [here for _, here in opens] == [True, False]
    assert notes == ["a", "held"]
    assert let_go_at[0] - started < 1.0  # gave up at once; waiting would have taken the busy timeout (10 s)


def test_slow_opens_keep_to_the_executor_until_they_are_quick_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opens: list[tuple[str, bool]]
) -> None:
    """An open that took long (a cold disk; here a slow check of the file) sends the next opens
    to the executor, where they are still timed: once they are quick again, they run in place.
    The registry times opens on a clock of the test's, which only the slow check moves: a
    loaded machine's real opens, slow now and then, would send some of the later ones over too."""
    clock = [0.0]
    monkeypatch.setattr(
        registry_module, "time", SimpleNamespace(perf_counter=lambda: clock[0], monotonic=time.monotonic)
    )
    is_ready = schema.is_ready
    slow_once = [True]

    def slow_first_check(*args: Any, **kwargs: Any) -> bool:
        if slow_once.pop() if slow_once else False:
            clock[0] += registry_module.INLINE_OPEN_MAX_SECONDS * 20  # an open that takes this long
        return is_ready(*args, **kwargs)

    async def scenario() -> list[bool]:
        await written_and_closed(tmp_path, "a")
        opens.clear()
        monkeypatch.setattr(schema, "is_ready", slow_first_check)
        async with registry(tmp_path, lambda: 1) as objects:
            for _ in range(40):
                async with objects.use(KEY):
                    pass
                await objects.close_object(KEY)
        return [here for _, here in opens]

    here = asyncio.run(scenario())
    assert here[0] is True  # the slow one, in place
    assert here[1] is False
    assert here[-1] is True
    assert all(here[here.index(True, 1) :])


def test_a_caller_cancelled_while_it_opens_an_object_leaves_the_open_to_those_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call that starts an open may be cancelled (its deadline) while the open runs on the
    executor. The calls waiting for that open were handed its CancelledError, although nobody
    cancelled them, and gRPC then answered them nothing: they hung. Now the open runs on, the
    waiters get the object, and the use it was opened for is given back."""
    entered, release = threading.Event(), threading.Event()
    open_ready = ObjectStore.open_ready

    def held_open(*args: Any, **options: Any) -> ObjectStore | None:
        entered.set()
        assert release.wait(timeout=30), "the open was never released"
        return open_ready(*args, **options)

    async def scenario() -> tuple[bool, list[str], int, int]:
        async with registry(tmp_path, lambda: 5) as objects:  # busy: opens run on the executor
            async with objects.use(KEY) as store:
                await store.write(add_note("kept"))
            await objects.close_object(KEY)
            monkeypatch.setattr(ObjectStore, "open_ready", staticmethod(held_open))

            async def use() -> list[str]:
                async with objects.use(KEY) as store:
                    return await store.read(lambda conn: [r[0] for r in conn.execute("SELECT value FROM _cf_KV")])

            opener = asyncio.ensure_future(use())
            await asyncio.to_thread(entered.wait, 30)  # the open is under way on the executor
            waiter = asyncio.ensure_future(use())
            await asyncio.sleep(0)  # the waiter finds the open under way and waits for it
            opener.cancel()
            await asyncio.wait([opener])
            release.set()
            found = await asyncio.wait_for(waiter, 30)
            monkeypatch.setattr(ObjectStore, "open_ready", staticmethod(open_ready))
            (store,) = [s for key, s in objects._open.items() if key == KEY]
            return opener.cancelled(), found, store.users, objects.open_count

    cancelled, found, users, open_count = asyncio.run(scenario())
    assert cancelled
    assert "kept" in found
    assert (users, open_count) == (0, 1)  # the cancelled opener's use was given back
