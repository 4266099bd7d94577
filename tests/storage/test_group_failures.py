"""Writes queued together share one transaction and one commit (storage/store.py). When one of
them makes the whole transaction fail, in a statement or at the COMMIT, that one is refused and
the others are stored as they would have been without it: no write fails for another's sake,
and each stored write's change event is published once."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sessions_server.storage.feed import ChangeEvent
from sessions_server.storage.rows import StorageError
from sessions_server.storage.store import ObjectStore, WriteContext


class Jobs:
    """Write jobs that insert a named row into a scratch table, noting the transaction (the
    WriteContext) each run of theirs saw, and the change events the store published."""

    def __init__(self) -> None:
        self.contexts: dict[str, list[WriteContext]] = {}  # kept alive, so that each is told apart
        self.published: list[str] = []

    def insert(self, name: str, table: str = "scratch", value: str = "small") -> Callable[[WriteContext], str]:
        self.contexts[name] = []

        def run(ctx: WriteContext) -> str:
            self.contexts[name].append(ctx)
            ctx.conn.execute(f"INSERT INTO {table} VALUES (?, ?)", (name, value))
            ctx.emit(ChangeEvent("clear", name))
            return name

        return run


def _run(path: Path, jobs: Jobs, prepare: list[str], group: Callable[[ObjectStore], Awaitable[list[Any]]]) -> list[Any]:
    """Opens a store at `path`, runs the `prepare` statements on its writer (`{room}`: a few pages
    more than the file has), then `group`."""

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=2)
        store = await loop.run_in_executor(executor, ObjectStore.open, "key", path, executor)
        store.feed.publish = lambda events: jobs.published.extend(e.session_id for e in events)  # type: ignore[method-assign]
        try:
            await store.write(lambda ctx: ctx.conn.execute("CREATE TABLE scratch (name TEXT, value TEXT)"))
            pages = store._writer.execute("PRAGMA page_count").fetchone()[0]
            for statement in prepare:
                store._writer.execute(statement.format(room=pages + 4))
            return await group(store)
        finally:
            await store.close()
            executor.shutdown(wait=True)

    return asyncio.run(scenario())


def _together(store: ObjectStore, *runs: Callable[[WriteContext], str]) -> Awaitable[list[Any]]:
    """The writes queued at once: the writer takes them as one batch."""
    return asyncio.gather(*(store.write(run) for run in runs), return_exceptions=True)


def _names(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [name for (name,) in conn.execute("SELECT name FROM scratch ORDER BY rowid")]


# A row of `owned` must name a row of `owner`, checked only at COMMIT: a write that breaks the
# rule makes the group's COMMIT fail, as a full disk does when the WAL cannot grow.
CHECKED_AT_COMMIT = [
    "CREATE TABLE owner (name TEXT PRIMARY KEY)",
    "CREATE TABLE owned (name TEXT REFERENCES owner (name) DEFERRABLE INITIALLY DEFERRED, value TEXT)",
    "PRAGMA foreign_keys = ON",
]


def test_a_write_that_ends_the_transaction_mid_statement_is_refused_alone(tmp_path: Path) -> None:
    """The middle write fills a file capped a few pages above its size; SQLite then abandons the
    whole transaction (as it does for a full disk mid-statement)."""
    path, jobs = tmp_path / "x.sqlite", Jobs()
    outcomes = _run(
        path,
        jobs,
        ["PRAGMA max_page_count = {room}"],
        lambda store: _together(store, jobs.insert("a"), jobs.insert("big", value="x" * 2_000_000), jobs.insert("c")),
    )
    assert outcomes[0] == "a" and outcomes[2] == "c", outcomes
    assert isinstance(outcomes[1], StorageError) and outcomes[1].out_of_space, outcomes
    assert "nothing was written" in str(outcomes[1])
    assert jobs.contexts["big"][0] is jobs.contexts["a"][0]  # one transaction held a and big
    assert len(jobs.contexts["a"]) == 2 and jobs.contexts["a"][1] is jobs.contexts["c"][0]  # then a and c
    assert jobs.published == ["a", "c"]
    assert _names(path) == ["a", "c"]


def test_a_group_whose_commit_fails_is_committed_job_by_job(tmp_path: Path) -> None:
    """The COMMIT of the group fails (here a deferred foreign key the middle write breaks, which
    SQLite checks at COMMIT, as a full disk shows at COMMIT when the WAL cannot grow): each
    write runs again with a commit of its own, and only the one at fault is refused."""
    path, jobs = tmp_path / "x.sqlite", Jobs()
    outcomes = _run(
        path,
        jobs,
        CHECKED_AT_COMMIT,
        lambda store: _together(store, jobs.insert("a"), jobs.insert("orphan", table="owned"), jobs.insert("c")),
    )
    assert outcomes[0] == "a" and outcomes[2] == "c", outcomes
    refused = outcomes[1]
    assert isinstance(refused, StorageError) and "commit failed, nothing was written" in str(refused), refused
    assert len({id(jobs.contexts[name][0]) for name in ("a", "orphan", "c")}) == 1  # first, one transaction
    assert [len(jobs.contexts[name]) for name in ("a", "orphan", "c")] == [2, 2, 2]  # then each alone
    assert len({id(run) for runs in jobs.contexts.values() for run in runs[1:]}) == 3
    assert jobs.published == ["a", "c"]
    assert _names(path) == ["a", "c"]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM owned").fetchone() == (0,)


def test_a_job_refused_inside_a_group_is_not_run_again_when_the_commit_fails(tmp_path: Path) -> None:
    """A write refused on its own account (rolled back to its savepoint) keeps that answer; the
    writes that had succeeded are the ones run again."""
    path, jobs = tmp_path / "x.sqlite", Jobs()
    outcomes = _run(
        path,
        jobs,
        CHECKED_AT_COMMIT,
        lambda store: _together(
            store, jobs.insert("a"), jobs.insert("missing", table="nowhere"), jobs.insert("orphan", table="owned")
        ),
    )
    assert outcomes[0] == "a"
    assert isinstance(outcomes[1], StorageError) and "no such table" in str(outcomes[1]), outcomes
    assert isinstance(outcomes[2], StorageError) and "commit failed" in str(outcomes[2]), outcomes
    assert [len(jobs.contexts[name]) for name in ("a", "missing", "orphan")] == [2, 1, 2]
    assert jobs.published == ["a"]
    assert _names(path) == ["a"]
