"""Where a read runs (storage/store.py `ObjectStore.read`).

A read its caller marks quick runs on the calling thread (the event loop's) when the caller is
the server's only request and the object's quick reads have been quick; every other read runs
on the executor. A quick read in place never waits for a lock: it runs again on the executor."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from sessions_server.storage import schema
from sessions_server.storage import store as store_module
from sessions_server.storage.rows import QueryInterrupted, StorageError, StoreClosed
from sessions_server.storage.store import ObjectStore, WriteContext
from tests.storage.test_write_threads import note, opened, stored_notes


@pytest.fixture(autouse=True)
def any_read_is_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """However slowly this machine reads, these tests count it as quick (one test below
    restores the real limit to show what a slow read does)."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)


def notes_and_thread(conn: sqlite3.Connection) -> tuple[list[str], int]:
    """A read answering the stored notes and the id of the thread it ran on."""
    return [str(row[0]) for row in conn.execute("SELECT body FROM notes ORDER BY rowid")], threading.get_ident()


def test_a_lone_quick_read_runs_on_the_calling_thread_and_sees_committed_writes(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[list[str], int, list[str], int, int]:
        async with opened(path, lambda: 1) as store:
            await store.write(note("first"))  # on the writer thread
            before, ran_on = await store.read(notes_and_thread, quick=True)
            await store.write(note("second"), size_hint=100)  # in place
            after, _ = await store.read(notes_and_thread, quick=True)
            return before, ran_on, after, store.inline_reads, store.inline_writes

    before, ran_on, after, inline_reads, inline_writes = asyncio.run(scenario())
    assert ran_on == threading.get_ident()
    assert (before, after) == (["first"], ["first", "second"])
    assert (inline_reads, inline_writes) == (2, 1)


@pytest.mark.parametrize(
    ("calls", "quick"),
    [
        (lambda: 2, True),  # another request is being handled
        (lambda: 1, False),  # the caller does not know the read to be short
        (None, True),  # the server does not count its calls
    ],
    ids=["another call in flight", "not marked quick", "no call count"],
)
def test_other_reads_run_on_the_executor(tmp_path: Path, calls: Callable[[], int] | None, quick: bool) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[list[str], int, int]:
        async with opened(path, calls) as store:
            await store.write(note("n"))
            notes, ran_on = await store.read(notes_and_thread, quick=quick)
            return notes, ran_on, store.inline_reads

    notes, ran_on, inline_reads = asyncio.run(scenario())
    assert notes == ["n"]
    assert ran_on != threading.get_ident()
    assert inline_reads == 0


def test_a_read_that_meets_a_lock_in_place_runs_again_on_the_executor(tmp_path: Path) -> None:
    """Readers of a WAL file rarely meet a lock, but when one does (recovery after a crash, a
    connection in exclusive mode), the event loop must not wait the busy timeout for it: the
    read gives up at once and runs again on the executor, where reads wait as usual."""
    path = tmp_path / "object.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as taken:
        other.execute("BEGIN IMMEDIATE")  # a real SQLITE_BUSY, raised by the read below
    holder.execute("ROLLBACK")
    holder.close()
    other.close()
    assert taken.value.sqlite_errorcode == sqlite3.SQLITE_BUSY
    attempts: list[tuple[int, int]] = []

    def locked_in_place(conn: sqlite3.Connection) -> tuple[int, int]:
        waits = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        attempts.append((threading.get_ident(), waits))
        if threading.get_ident() == loop_thread:
            raise taken.value
        return threading.get_ident(), waits

    loop_thread = threading.get_ident()

    async def scenario() -> tuple[int, int, int]:
        async with opened(path, lambda: 1) as store:
            ran_on, waits = await store.read(locked_in_place, quick=True)
            return ran_on, waits, store.inline_reads

    ran_on, waits, inline_reads = asyncio.run(scenario())
    assert [thread == loop_thread for thread, _ in attempts] == [True, False]
    assert attempts[0][1] == 0  # in place: gives up at once
    assert ran_on != loop_thread
    assert waits == schema.BUSY_TIMEOUT_MS  # on the executor: waits the usual busy timeout
    assert inline_reads == 0


def test_a_failing_read_in_place_reports_a_storage_error_and_the_store_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    def bad_query(conn: sqlite3.Connection) -> None:
        conn.execute("SELECT no_such_column FROM notes")

    async def scenario() -> tuple[str, list[str], int]:
        async with opened(path, lambda: 1) as store:
            await store.write(note("kept"))
            with pytest.raises(StorageError) as failed:
                await store.read(bad_query, quick=True)
            notes, _ = await store.read(notes_and_thread, quick=True)
            return str(failed.value), notes, store.inline_reads

    message, notes, inline_reads = asyncio.run(scenario())
    assert "no_such_column" in message
    assert notes == ["kept"]
    assert inline_reads == 1


def test_a_read_in_place_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A read runs in a transaction (one snapshot across its statements); one that failed midway
    must not pin the WAL: the next write's checkpoint, and every later read, see new data."""
    path = tmp_path / "object.sqlite"

    def snapshot_then_fail(conn: sqlite3.Connection) -> None:
        assert conn.in_transaction
        conn.execute("SELECT count(*) FROM notes").fetchone()
        raise ValueError("the read's own failure")

    async def scenario() -> list[str]:
        async with opened(path, lambda: 1) as store:
            await store.write(note("before"))
            with pytest.raises(ValueError):
                await store.read(snapshot_then_fail, quick=True)
            await store.write(note("after"), size_hint=100)
            notes, _ = await store.read(notes_and_thread, quick=True)
            return notes

    assert asyncio.run(scenario()) == ["before", "after"]


def test_slow_quick_reads_keep_to_the_executor_until_they_are_quick_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quick read that took long (a huge message, a cold disk; here a slow read) sends this
    object's next quick reads to the executor, where they are still timed: once they are
    quick again, they run in place again. The store times reads on a clock of the test's,
    which only the slow read moves: a loaded machine's real reads, slow now and then, would
    send some of the later ones over too."""
    clock = [0.0]
    monkeypatch.setattr(
        store_module,
        "time",
        SimpleNamespace(monotonic=lambda: clock[0], perf_counter=time.perf_counter, time=time.time),
    )
    path = tmp_path / "object.sqlite"

    def slow(conn: sqlite3.Connection) -> int:
        clock[0] += store_module.INLINE_MAX_SECONDS * 20  # a read that takes this long
        return threading.get_ident()

    def fast(conn: sqlite3.Connection) -> int:
        return threading.get_ident()

    async def scenario() -> list[bool]:
        async with opened(path, lambda: 1) as store:
            await store.read(slow, quick=True)
            return [await store.read(fast, quick=True) == threading.get_ident() for _ in range(40)]

    here = asyncio.run(scenario())
    assert here[0] is False
    assert here[-1] is True
    assert all(here[here.index(True) :])


def test_a_read_that_outlasts_its_time_in_place_runs_again_on_the_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read marked quick that is not (a huge message, a cold disk; here a long computation in
    SQL) stops once it has held the event loop for INLINE_MAX_SECONDS and runs to the end on the
    executor, with no time limit there."""
    limit = 0.005
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", limit)
    path = tmp_path / "object.sqlite"
    loop_thread = threading.get_ident()
    attempts: list[tuple[bool, bool]] = []  # (ran in place, ran to the end)

    def long_count(conn: sqlite3.Connection) -> tuple[int, int]:
        finished = False
        try:
            (total,) = conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) "
                "SELECT count(*) FROM n"
            ).fetchone()
            finished = True
            return int(total), threading.get_ident()
        finally:
            attempts.append((threading.get_ident() == loop_thread, finished))

    async def scenario() -> tuple[int, int, int]:
        async with opened(path, lambda: 1) as store:
            total, ran_on = await store.read(long_count, quick=True)
            return total, ran_on, store.inline_reads

    total, ran_on, inline_reads = asyncio.run(scenario())
    assert total == 300000
    assert ran_on != loop_thread
    assert inline_reads == 0
    assert attempts == [(True, False), (False, True)]  # stopped in place, run to the end once


LONG_COUNT_SQL = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT count(*) FROM n"
)


def test_a_read_stopped_in_place_sends_only_its_kind_to_the_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a read of one kind (a search of a large object, say) has run out of time in place,
    the next read of that kind goes straight to the executor, not to be stopped again; quick
    reads of other kinds keep running in place."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 0.005)
    path = tmp_path / "object.sqlite"
    loop_thread = threading.get_ident()
    attempts: list[bool] = []

    def long_read(conn: sqlite3.Connection) -> None:
        in_place = threading.get_ident() == loop_thread
        attempts.append(in_place)
        if in_place:
            conn.execute(LONG_COUNT_SQL).fetchone()  # stopped after INLINE_MAX_SECONDS
        else:
            time.sleep(0.01)  # stands in for the whole read, longer than its time in place

    def thread_of(conn: sqlite3.Connection) -> int:
        conn.execute("SELECT 1").fetchone()
        return threading.get_ident()

    async def scenario() -> tuple[int, int]:
        async with opened(path, lambda: 1) as store:
            await store.read(long_read, quick=True, kind="long")
            await store.read(long_read, quick=True, kind="long")
            return await store.read(thread_of, quick=True), store.inline_reads

    point_ran_on, inline_reads = asyncio.run(scenario())
    assert attempts == [True, False, False]  # stopped once in place; the second went straight over
    assert point_ran_on == loop_thread
    assert inline_reads == 1


@pytest.mark.parametrize("in_place", [True, False], ids=["in place", "on the executor"])
def test_a_read_past_its_deadline_is_stopped_and_not_run_again(tmp_path: Path, in_place: bool) -> None:
    """A read with a deadline (a search's budget) is stopped once the clock passes it, wherever
    it runs, and raises QueryInterrupted; in place, it is not run again on the executor."""
    path = tmp_path / "object.sqlite"
    loop_thread = threading.get_ident()
    attempts: list[tuple[bool, bool]] = []  # (ran in place, ran to the end)

    def long_count(conn: sqlite3.Connection) -> int:
        finished = False
        try:
            total = int(conn.execute(LONG_COUNT_SQL).fetchone()[0])
            finished = True
            return total
        finally:
            attempts.append((threading.get_ident() == loop_thread, finished))

    async def scenario() -> int:
        async with opened(path, lambda: 1) as store:
            with pytest.raises(QueryInterrupted):
                await store.read(long_count, quick=in_place, kind="long", deadline=time.monotonic() + 0.001)
            # The connection it ran on keeps no time limit: the same read without one finishes.
            return await store.read(long_count, quick=in_place, kind="long")

    assert asyncio.run(scenario()) == 300000
    # The stopped read did not run again, and ran where it was sent: the deadline's stop, not
    # the time in place's.
    assert attempts == [(in_place, False), (in_place, True)]


def test_reads_wait_for_nothing_the_writer_does(tmp_path: Path) -> None:
    """A quick read in place reads the last committed state while the writer holds its write
    transaction open (WAL readers never wait for the writer)."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[list[str], int]:
        async with opened(path, lambda: 1) as store:
            await store.write(note("committed"))
            writer = sqlite3.connect(path, isolation_level=None)
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("INSERT INTO notes (body) VALUES ('uncommitted')")
            try:
                notes, ran_on = await store.read(notes_and_thread, quick=True)
            finally:
                writer.execute("ROLLBACK")
                writer.close()
            return notes, ran_on

    notes, ran_on = asyncio.run(scenario())
    assert notes == ["committed"]
    assert ran_on == threading.get_ident()


def open_descriptors(path: Path) -> int:
    """This process's file descriptors open on `path` (every SQLite connection holds one)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if fd.resolve() == path.resolve())


def test_reads_in_place_use_the_writers_connection_and_closing_closes_it(tmp_path: Path) -> None:
    """A read in place opens no connection of its own (a cold object's first read would pay
    for one): it reads on the writer's, which is idle then."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[ObjectStore, int, int]:
        async with opened(path, lambda: 1) as store:
            await store.read(notes_and_thread, quick=True)
            open_while_open = open_descriptors(path)
        return store, open_while_open, store.inline_reads

    store, open_while_open, inline_reads = asyncio.run(scenario())
    assert inline_reads == 1
    assert open_while_open == 1  # the writer's connection only
    assert open_descriptors(path) == 0
    with pytest.raises(StoreClosed, match="closed"):
        asyncio.run(store.read(notes_and_thread, quick=True))


def test_a_quick_read_while_the_writer_thread_commits_runs_on_the_executor(tmp_path: Path) -> None:
    """The writer's connection is not idle while a write runs on the writer thread: a quick
    read then runs on the executor and sees the last committed state, not the write under way."""
    path = tmp_path / "object.sqlite"
    started, release = threading.Event(), threading.Event()

    def held_write(ctx: WriteContext) -> None:
        ctx.conn.execute("INSERT INTO notes (body) VALUES ('uncommitted')")
        started.set()
        release.wait(30)

    async def scenario() -> tuple[list[str], int, list[str], int, int]:
        async with opened(path, lambda: 1) as store:
            await store.write(note("committed"), size_hint=100)
            writing = asyncio.ensure_future(store.write(held_write))  # no size hint: the writer thread
            try:
                assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
                during, ran_on = await store.read(notes_and_thread, quick=True)
                in_place_during = store.inline_reads
            finally:
                release.set()
            await writing
            after, _ = await store.read(notes_and_thread, quick=True)
            return during, ran_on, after, in_place_during, store.inline_reads

    during, ran_on, after, in_place_during, in_place_after = asyncio.run(scenario())
    assert during == ["committed"]
    assert ran_on != threading.get_ident()
    assert in_place_during == 0
    assert after == ["committed", "uncommitted"]
    assert in_place_after == 1


def test_a_read_in_place_leaves_no_time_limit_on_the_writers_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The time limit of a read in place is the read's alone: a write that runs long on the same
    connection afterwards is not stopped."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 0.005)
    path = tmp_path / "object.sqlite"

    def long_write(ctx: WriteContext) -> None:
        ctx.conn.execute(
            "INSERT INTO notes (body) SELECT count(*) FROM "
            "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT i FROM n)"
        )

    async def scenario() -> tuple[list[str], int]:
        async with opened(path, lambda: 1) as store:
            await store.read(notes_and_thread, quick=True)
            await store.write(long_write)
            notes, _ = await store.read(notes_and_thread, quick=True)
            return notes, store.inline_reads

    notes, inline_reads = asyncio.run(scenario())
    assert notes == ["300000"]
    assert inline_reads == 2


def test_a_read_in_place_never_meets_an_open_write_transaction(tmp_path: Path) -> None:
    """Should the writer's connection hold a transaction while no write is under way (it never
    should), a quick read takes the executor: on that connection it would see the uncommitted
    rows, and its clean-up would roll them back."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[list[str], int, bool, list[str]]:
        async with opened(path, lambda: 1) as store:
            await store.write(note("committed"), size_hint=100)
            writer = store._writer
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("INSERT INTO notes (body) VALUES ('pending')")
            during, ran_on = await store.read(notes_and_thread, quick=True)
            still_open = writer.in_transaction
            writer.execute("COMMIT")
            after, _ = await store.read(notes_and_thread, quick=True)
            return during, ran_on, still_open, after

    during, ran_on, still_open, after = asyncio.run(scenario())
    assert during == ["committed"]
    assert ran_on != threading.get_ident()
    assert still_open
    assert after == ["committed", "pending"]


def test_the_writer_keeps_temporary_storage_in_memory_and_readers_the_default(tmp_path: Path) -> None:
    """The writer's savepoints need no statement journal files; a reader that sorted many rows in
    memory (a search for a common word) made its next statement release them, 5-20 ms."""
    path = tmp_path / "object.sqlite"
    memory, default = 2, 0  # PRAGMA temp_store values

    async def scenario() -> tuple[int, int]:
        async with opened(path, None) as store:
            writer = await store.write(lambda ctx: ctx.conn.execute("PRAGMA temp_store").fetchone()[0])
            reader = await store.read(lambda conn: conn.execute("PRAGMA temp_store").fetchone()[0])
            return writer, reader

    assert asyncio.run(scenario()) == (memory, default)


@pytest.mark.parametrize("calls", [lambda: 2, lambda: 1], ids=["on the executor", "in place"])
def test_a_read_sees_one_committed_state_throughout(tmp_path: Path, calls: Callable[[], int]) -> None:
    """A read is several statements (a message's row, then its continuation rows): on a reader
    connection in autocommit each saw the state of its own moment, so a large message updated
    between them came back torn, one version's first slice joined to another's rest. A read is
    one snapshot now, whatever commits meanwhile."""
    path = tmp_path / "object.sqlite"

    def read_around_a_commit(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
        first = [str(row[0]) for row in conn.execute("SELECT body FROM notes ORDER BY rowid")]
        with sqlite3.connect(path, isolation_level=None) as other:  # another writer commits meanwhile
            other.execute("PRAGMA busy_timeout = 5000")
            other.execute("INSERT INTO notes (body) VALUES ('meanwhile')")
        second = [str(row[0]) for row in conn.execute("SELECT body FROM notes ORDER BY rowid")]
        return first, second

    async def scenario() -> tuple[list[str], list[str]]:
        async with opened(path, calls) as store:
            await store.write(note("first"))
            return await store.read(read_around_a_commit, quick=True)

    first, second = asyncio.run(scenario())
    assert first == second == ["first"]
    assert stored_notes(path) == ["first", "meanwhile"]


def test_the_active_leaf_is_the_snapshots_newest_row_whatever_the_writers_cache_says(tmp_path: Path) -> None:
    """A read resolved the active leaf from the writer's cached tail, taken before the read's
    snapshot began and checked only for the leaf's presence in it: with appends and an update
    committed in between, it answered a replaced leaf with the update's text, a state that never
    existed. The leaf is the snapshot's own newest row now; a stale cache changes nothing."""

    async def scenario() -> list[str | None]:
        async with opened(tmp_path / "object.sqlite", None) as store:
            rows = [("", f"x{i}", i, f"x{i - 1}" if i > 1 else None) for i in range(1, 4)]
            await store.write(
                lambda ctx: ctx.conn.executemany(
                    """INSERT INTO cf_agents_session_messages
                         (session_id, id, seq, parent_id, role, content, created_at)
                       VALUES (?, ?, ?, ?, 'user', '{}', 0)""",
                    rows,
                )
            )
            store._tails[""] = store_module.Tail("x1", 2)  # what a cache taken before x2, x3 says
            store._tails["gone"] = store_module.Tail("x1", 2)  # a session without rows
            return [await store.read(lambda conn, s=s: store.latest_leaf_id(conn, s)) for s in ("", "gone")]

    assert asyncio.run(scenario()) == ["x3", None]


def test_a_tail_read_from_a_snapshot_older_than_a_commit_is_not_cached(tmp_path: Path) -> None:
    """The active leaf a read finds is cached for writers only if nothing committed since the
    read began. Checked once the leaf was read, a commit that came after the read's snapshot
    but before the check was taken as already in it: the snapshot's older tail was cached, and
    the next appends took a parent and seq that were no longer the session's newest (found by a
    concurrency audit while a read's snapshot began earlier than its leaf)."""
    snapshot_taken, committed = threading.Event(), threading.Event()

    def leaf_after_a_commit(store: ObjectStore, conn: sqlite3.Connection) -> str | None:
        conn.execute("SELECT count(*) FROM cf_agents_session_messages").fetchall()  # the snapshot begins
        snapshot_taken.set()
        assert committed.wait(timeout=30), "the commit never came"
        return store.latest_leaf_id(conn, "")

    def insert(*ids: str) -> Callable[[WriteContext], object]:
        rows = [("", message_id, int(message_id[1:]), None) for message_id in ids]
        sql = """INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at)
                 VALUES (?, ?, ?, ?, 'user', '{}', 0)"""
        return lambda ctx: ctx.conn.executemany(sql, rows)

    async def scenario() -> tuple[str | None, store_module.Tail | None]:
        async with opened(tmp_path / "object.sqlite", None) as store:  # reads on the executor
            await store.write(insert("x1", "x2", "x3"))
            reading = asyncio.ensure_future(store.read(lambda conn: leaf_after_a_commit(store, conn)))
            assert await asyncio.to_thread(snapshot_taken.wait, 30)
            await store.write(insert("x4"))
            committed.set()
            return await reading, store._tails.get("")

    leaf, cached = asyncio.run(scenario())
    assert leaf == "x3"  # the snapshot's
    assert cached is None or cached.leaf_id == "x4"
