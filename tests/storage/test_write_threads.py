"""Where a write commits (storage/store.py `ObjectStore.write`).

A small write whose caller is the server's only request commits on the calling thread (the event
loop's); every other write goes to the object's writer thread and commits in a group. Either way
the write is durable when it returns, and a failing job writes nothing."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from sessions_server.storage import schema
from sessions_server.storage import store as store_module
from sessions_server.storage.store import INLINE_MAX_BYTES, ObjectStore, WriteContext


@pytest.fixture(autouse=True)
def any_disk_is_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """However slowly this machine commits, these tests count it as quick (one test below
    restores the real limit to show what a slow commit does)."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)


@asynccontextmanager
async def opened(path: Path, calls_in_flight: Callable[[], int] | None) -> AsyncIterator[ObjectStore]:
    executor = ThreadPoolExecutor(max_workers=2)
    loop = asyncio.get_running_loop()
    store = await loop.run_in_executor(executor, ObjectStore.open, "key", path, executor, None, calls_in_flight)
    try:
        await store.write(lambda ctx: ctx.conn.execute("CREATE TABLE notes (body TEXT NOT NULL)"))
        yield store
    finally:
        await store.close()
        executor.shutdown()


def note(body: str) -> Callable[[WriteContext], int]:
    """A job that stores `body` and answers the id of the thread it ran on."""

    def run(ctx: WriteContext) -> int:
        ctx.conn.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        return threading.get_ident()

    return run


def stored_notes(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [str(row[0]) for row in conn.execute("SELECT body FROM notes ORDER BY rowid")]


def counts(*values: int) -> Callable[[], int]:
    """A `calls_in_flight` that answers `values` in turn, then the last one forever."""
    answers: Iterator[int] = iter(values)
    return lambda: next(answers, values[-1])


def test_a_lone_small_write_commits_on_the_calling_thread(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int, list[str]]:
        async with opened(path, lambda: 1) as store:
            ran_on = await store.write(note("first"), size_hint=100)
            visible = stored_notes(path)  # another connection sees it as soon as write returns
            return ran_on, store.inline_writes, visible

    ran_on, inline_writes, visible = asyncio.run(scenario())
    assert ran_on == threading.get_ident()
    assert inline_writes == 1
    assert visible == ["first"]


@pytest.mark.parametrize(
    ("calls", "size_hint"),
    [
        (lambda: 2, 100),  # another request is being handled
        (lambda: 1, None),  # the caller gave no estimate
        (lambda: 1, INLINE_MAX_BYTES + 1),  # too large to hold up the event loop
        (None, 100),  # the server does not count its calls
    ],
    ids=["another call in flight", "no size hint", "large write", "no call count"],
)
def test_other_writes_commit_on_the_writer_thread(
    tmp_path: Path, calls: Callable[[], int] | None, size_hint: int | None
) -> None:
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[int, int]:
        async with opened(path, calls) as store:
            return await store.write(note("n"), size_hint=size_hint), store.inline_writes

    ran_on, inline_writes = asyncio.run(scenario())
    assert ran_on != threading.get_ident()
    assert inline_writes == 0
    assert stored_notes(path) == ["n"]


def test_a_moment_alone_under_concurrency_does_not_split_the_group(tmp_path: Path) -> None:
    """Writes that recently saw 16 calls in flight keep to the writer thread when one of them
    finds itself alone; once the server stays quiet, writes commit in place again."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> list[bool]:
        async with opened(path, counts(16, 16, 1)) as store:
            here = []
            for i in range(16):
                ran_on = await store.write(note(f"n{i}"), size_hint=100)
                here.append(ran_on == threading.get_ident())
            return here

    here = asyncio.run(scenario())
    assert here[:6] == [False] * 6
    assert here[-1] is True
    assert here.index(True) > 2 and all(here[here.index(True) :])
    assert stored_notes(path) == [f"n{i}" for i in range(16)]


def test_slow_commits_keep_writes_on_the_writer_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that took long (a slow disk, here a slow job) sends the next writes to the
    thread, so the event loop never waits on such a disk."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 0.005)
    path = tmp_path / "object.sqlite"
    slow_seconds = 0.005 * 8

    def slow(ctx: WriteContext) -> int:
        time.sleep(slow_seconds)  # stands in for a disk that takes this long to commit
        return note("slow")(ctx)

    async def scenario() -> int:
        async with opened(path, lambda: 1) as store:
            await store.write(slow)  # no size hint: on the writer thread
            return await store.write(note("after"), size_hint=100)

    assert asyncio.run(scenario()) != threading.get_ident()
    assert stored_notes(path) == ["slow", "after"]


def test_a_failing_job_in_place_writes_nothing_and_the_store_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"

    class Refused(Exception):
        pass

    def half_then_fail(ctx: WriteContext) -> None:
        note("half")(ctx)
        raise Refused("the job refused after writing a row")

    async def scenario() -> tuple[int, int]:
        async with opened(path, lambda: 1) as store:
            with pytest.raises(Refused):
                await store.write(half_then_fail, size_hint=100)
            return await store.write(note("next"), size_hint=100), store.inline_writes

    ran_on, inline_writes = asyncio.run(scenario())
    assert ran_on == threading.get_ident()
    assert inline_writes == 2
    assert stored_notes(path) == ["next"]


def test_a_write_lock_held_elsewhere_never_blocks_the_event_loop(tmp_path: Path) -> None:
    """Another connection (a replicator's checkpoint, say) holds the write lock: the write does
    not wait for it on the event loop but queues for the writer thread, which waits as usual
    and commits once the lock is free."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[float, bool, int, int]:
        async with opened(path, lambda: 1) as store:
            holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            write = asyncio.ensure_future(store.write(note("waited"), size_hint=100))
            await asyncio.sleep(0)  # the write's synchronous part: try in place, else queue
            queued_after = time.monotonic() - started
            done_while_locked = write.done()
            holder.execute("ROLLBACK")
            holder.close()
            return queued_after, done_while_locked, await write, store.inline_writes

    queued_after, done_while_locked, ran_on, inline_writes = asyncio.run(scenario())
    # Waiting for the lock in place would take the busy timeout (10 s) before giving up.
    assert queued_after < schema.BUSY_TIMEOUT_MS / 1000 / 2
    assert not done_while_locked
    assert ran_on != threading.get_ident()
    assert inline_writes == 0
    assert stored_notes(path) == ["waited"]


def test_writes_on_the_writer_thread_still_wait_for_locks(tmp_path: Path) -> None:
    """Only the attempt in place gives up on a taken lock at once; the writer thread waits the
    usual busy timeout, also after writes were committed in place."""
    path = tmp_path / "object.sqlite"

    def busy_timeout(ctx: WriteContext) -> tuple[int, int]:
        return int(ctx.conn.execute("PRAGMA busy_timeout").fetchone()[0]), threading.get_ident()

    async def scenario() -> tuple[int, int, int]:
        async with opened(path, lambda: 1) as store:
            await store.write(note("in place"), size_hint=100)
            waits, ran_on = await store.write(busy_timeout)
            return waits, ran_on, store.inline_writes

    waits, ran_on, inline_writes = asyncio.run(scenario())
    assert inline_writes == 1
    assert ran_on != threading.get_ident()
    assert waits == schema.BUSY_TIMEOUT_MS


def test_a_write_never_overtakes_queued_writes(tmp_path: Path) -> None:
    """A write that finds jobs queued for the writer thread queues behind them, however alone
    its caller is: writes to an object commit in the order they were made."""
    path = tmp_path / "object.sqlite"

    async def scenario() -> tuple[list[int], int]:
        async with opened(path, lambda: 1) as store:
            ran_on = await asyncio.gather(
                store.write(note("queued first")), store.write(note("small, second"), size_hint=100)
            )
            return list(ran_on), store.inline_writes

    ran_on, inline_writes = asyncio.run(scenario())
    assert stored_notes(path) == ["queued first", "small, second"]
    assert inline_writes == 0
    assert threading.get_ident() not in ran_on


def test_a_queued_job_whose_caller_went_is_dropped_and_the_rest_commit(tmp_path: Path) -> None:
    """Under overload most of a queue could be writes whose callers had been answered
    DEADLINE_EXCEEDED, committed for nobody while live callers waited behind them. A job not yet
    taken into a commit when its caller is cancelled writes nothing; one taken goes on."""
    path = tmp_path / "object.sqlite"
    running, release = threading.Event(), threading.Event()

    def held(ctx: WriteContext) -> int:
        ctx.conn.execute("INSERT INTO notes (body) VALUES ('held')")
        running.set()
        assert release.wait(timeout=30), "the held commit was never released"
        return 0

    async def scenario() -> None:
        async with opened(path, None) as store:
            first = asyncio.ensure_future(store.write(held))  # taken: the writer thread holds it
            await asyncio.to_thread(running.wait, 30)
            gone = asyncio.ensure_future(store.write(note("gone")))
            kept = asyncio.ensure_future(store.write(note("kept")))
            await asyncio.sleep(0)  # both queued behind the held commit
            gone.cancel()
            first.cancel()  # its job is in a commit already: it still commits
            release.set()
            await kept
            with pytest.raises(asyncio.CancelledError):
                await gone
            with pytest.raises(asyncio.CancelledError):
                await first

    asyncio.run(scenario())
    assert stored_notes(path) == ["held", "kept"]


def test_reads_that_hold_every_read_thread_do_not_hold_a_commit(tmp_path: Path) -> None:
    """Commits ran on the threads reads use: 200 history streams filled them all and other
    objects' writes waited (p99 5.5 s). They have a pool of their own."""
    path = tmp_path / "object.sqlite"
    reads, commits = ThreadPoolExecutor(max_workers=1), ThreadPoolExecutor(max_workers=1)
    held, release = threading.Event(), threading.Event()

    def hold_the_read_thread() -> None:
        held.set()
        assert release.wait(timeout=60), "the read thread was never released"

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(
            reads, lambda: ObjectStore.open("key", path, reads, None, None, commit_executor=commits)
        )
        try:
            blocked = loop.run_in_executor(reads, hold_the_read_thread)
            await asyncio.to_thread(held.wait, 30)
            await store.write(lambda ctx: ctx.conn.execute("CREATE TABLE notes (body TEXT NOT NULL)"))
            await store.write(note("while every read thread is taken"))
            release.set()
            await blocked
        finally:
            release.set()
            await store.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    finally:
        reads.shutdown()
        commits.shutdown()
    assert stored_notes(path) == ["while every read thread is taken"]
