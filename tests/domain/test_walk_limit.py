"""A newest-first walk with a limit (StreamHistory `max_messages`) reads only the rows it returns;
the domain over real object files, no gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import paths
from sessions_server.domain.history import RecentSummary
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import queries
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def test_a_limited_newest_first_walk_reads_only_the_rows_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a limit a reader that stops early has read ahead; with one the walk's reads take
    no more rows than the messages still wanted (a fresh service: nothing remembered, so it walks)."""
    texts = [f'{{"id":"m{i:03d}","role":"user","parts":[{{"type":"text","text":"{i}"}}]}}' for i in range(200)]

    async def write() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        await service.append_many("walk", "", [AppendInput(t, Parent.auto(), True) for t in texts])
        await service.registry.close_all()

    asyncio.run(write())
    monkeypatch.setattr(paths, "_paths", type(paths._paths)())  # nothing remembered from the write
    rows_read: list[str] = []
    ancestors = queries.ancestors

    def counted(conn: Any, session_id: str, message_id: str, count: int, *args: Any, **kwargs: Any) -> Any:
        rows = ancestors(conn, session_id, message_id, count, *args, **kwargs)
        rows_read.extend(row.info.id for row in rows)
        return rows

    monkeypatch.setattr(queries, "ancestors", counted)

    async def read(limit: int) -> list[str]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            got = [
                view.info.id
                async for window in service.history("walk", "", newest_first=True, limit=limit)
                for view in window
                if view.info is not None
            ]
        finally:
            await service.registry.close_all()
        return got

    got = asyncio.run(read(10))
    assert got == [f"m{i:03d}" for i in range(199, 189, -1)]
    assert rows_read == got


def _texts(count: int) -> list[str]:
    return [f'{{"id":"m{i:03d}","role":"user","parts":[{{"type":"text","text":"{i}"}}]}}' for i in range(count)]


async def _read_whole(service: SessionsService, key: str) -> None:
    """A whole read: the path and its messages are then remembered."""
    async for _ in service.history(key, ""):
        pass


async def _newest_ids(service: SessionsService, key: str, limit: int) -> list[str]:
    return [
        view.info.id
        async for window in service.history(key, "", newest_first=True, limit=limit)
        for view in window
        if view.info is not None
    ]


def test_a_limited_newest_first_read_of_a_remembered_path_takes_only_its_newest_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a whole read, the last few messages come from the memo: no walk in storage, and only the
    rows returned are looked up there, however long the path."""
    looked_up: list[str] = []
    remembered_views = paths.remembered_views

    def counted(store: Any, session_id: str, ids: Any) -> Any:
        looked_up.extend(ids)
        return remembered_views(store, session_id, ids)

    async def run() -> list[str]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append_many("memo", "", [AppendInput(t, Parent.auto(), True) for t in _texts(300)])
            await _read_whole(service, "memo")
            monkeypatch.setattr(paths, "remembered_views", counted)
            monkeypatch.setattr(queries, "ancestors", None)  # a walk in storage would fail the test
            return await _newest_ids(service, "memo", 10)
        finally:
            await service.registry.close_all()

    got = asyncio.run(run())
    assert got == [f"m{i:03d}" for i in range(299, 289, -1)]
    assert looked_up == got


def test_rows_that_do_not_read_as_messages_are_passed_over_in_a_remembered_tail(tmp_path: Path) -> None:
    """A row upstream's reads skip (not JSON, no digest) is on the remembered path; a limited
    newest-first read still returns as many messages as asked, walking on past the tail."""

    async def write() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        await service.append_many("skip", "", [AppendInput(t, Parent.auto(), True) for t in _texts(30)])
        await service.registry.close_all()

    asyncio.run(write())
    with contextlib.closing(sqlite3.connect(object_path(tmp_path, "skip"))) as conn, conn:
        conn.execute(
            "UPDATE cf_agents_session_messages SET content = 'not json', content_hash = NULL WHERE id = 'm027'"
        )

    async def read(limit: int) -> list[str]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await _read_whole(service, "skip")
            return await _newest_ids(service, "skip", limit)
        finally:
            await service.registry.close_all()

    assert asyncio.run(read(5)) == ["m029", "m028", "m026", "m025", "m024"]
    assert asyncio.run(read(3)) == ["m029", "m028", "m026"]
    assert asyncio.run(read(40)) == [f"m{i:03d}" for i in range(29, -1, -1) if i != 27]


def test_a_budgeted_read_of_a_remembered_path_takes_its_newest_rows_without_a_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a first read, a recent-history read answers from the memo: it takes the newest rows
    and the path's stored bytes as kept, with no walk, copy or sum of the whole path."""

    async def run() -> tuple[RecentSummary, list[str], RecentSummary, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append_many("budget", "", [AppendInput(t, Parent.auto(), True) for t in _texts(300)])
            fresh = [item async for item in service.recent_history("budget", "", 1_000)]  # walks, remembers
            monkeypatch.setattr(paths, "path_stats", None)  # taking the whole path would fail the test
            await service.append_many("budget", "", [AppendInput(t, Parent.auto(), True) for t in _more(2)])
            again = [item async for item in service.recent_history("budget", "", 1_000)]
        finally:
            await service.registry.close_all()
        return fresh[0], _ids(fresh[1:]), again[0], _ids(again[1:])  # type: ignore[return-value]

    fresh_summary, fresh_ids, summary, ids = asyncio.run(run())
    texts = _texts(300)
    assert (fresh_summary, fresh_ids) == (RecentSummary(True, sum(map(len, texts))), _fitting(texts, 1_000))
    texts += _more(2)
    assert (summary, ids) == (RecentSummary(True, sum(map(len, texts))), _fitting(texts, 1_000))
    assert 2 < len(ids) < 300


def _fitting(texts: list[str], budget: int) -> list[str]:
    """The ids of the newest messages whose JSON fits `budget`, oldest first (at least one)."""
    taken = [texts[-1]]
    while len(taken) < len(texts) and sum(map(len, taken)) + len(texts[-len(taken) - 1]) <= budget:
        taken.insert(0, texts[-len(taken) - 1])
    return [text.split('"')[3] for text in taken]


def _more(count: int) -> list[str]:
    return [f'{{"id":"x{i}","role":"user","parts":[{{"type":"text","text":"{i}"}}]}}' for i in range(count)]


def _ids(windows: list[Any]) -> list[str]:
    return [view.info.id for window in windows for view in window if view.info is not None]


class _CountedLookups(dict):  # type: ignore[type-arg]
    """A session's remembered messages, counting the lookups a read makes."""

    lookups = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def test_a_recent_window_of_a_remembered_path_looks_up_only_its_own_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent reads its recent window after every turn. When the path is remembered but only
    the window's messages are (nothing read the older ones), the read looked every message of
    the path up before settling for the window: 2,000 lookups here, 1.5 ms at 10,000 rows."""

    monkeypatch.setattr(paths, "_paths", type(paths._paths)())  # this test's sessions only
    monkeypatch.setattr(paths, "_views", type(paths._views)())

    async def run() -> tuple[list[str], list[str], int]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append_many("recent", "", [AppendInput(t, Parent.auto(), True) for t in _texts(2_000)])

            async def window() -> list[str]:
                return [
                    view.info.id
                    async for item in service.recent_history("recent", "", 1_000)
                    if not isinstance(item, RecentSummary)
                    for view in item
                    if view.info is not None
                ]

            first = await window()  # walks the path, reads and remembers the window's messages
            (held,) = paths._views.values()
            counted = _CountedLookups(held.by_id)
            monkeypatch.setattr(held, "by_id", counted)
            second = await window()
            return first, second, counted.lookups
        finally:
            await service.registry.close_all()

    first, second, lookups = asyncio.run(run())
    assert first == second
    assert first[-1] == "m1999" and 0 < len(first) < 50
    assert lookups <= 2 * len(second)
