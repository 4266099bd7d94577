"""An import keeps parents as given, so a row may name a parent that is not stored, and rows
may form a cycle. What the server remembers of a session's path (its rows, its messages, its
token estimate) must stay what a walk finds:
- a path that stops at a missing parent is walked again when a row is appended under that id:
  the new row joins the path's root to its leaf (here closing a cycle, which a walk follows to
  its cap, as upstream's does); the memo only extended the path and the estimate by the row;
- a path that passes a row twice is not remembered: an update restated one place of it, and
  the estimate took the update's difference once.
The domain over real object files; each read is compared with one after the memos are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain import paths
from sessions_server.domain.compactor import Policy, forget_estimate
from sessions_server.domain.service import SessionsService
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import MAX_PATH_DEPTH, Parent


class _Summarizer:
    async def summarize(self, prompt: str) -> str:
        raise AssertionError("the threshold is never crossed here")


def _message(message_id: str, text: str = "") -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text or message_id}]})


Reads = tuple[list[str], list[tuple[str, int]], int]


async def _reads(service: SessionsService) -> Reads:
    history = [view.info.id async for window in service.history("k", "") for view in window]
    stats = [(row.id, row.token_estimate) for row in await service.row_stats("k", "")]
    async with service.object("k") as store:
        return history, stats, await service.compactor.token_estimate(store, "")


Scenario = Callable[[SessionsService], Awaitable[None]]


def _remembered_and_fresh(tmp_path: Path, scenario: Scenario) -> tuple[Reads, Reads]:
    async def main() -> tuple[Reads, Reads]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)), summarizer=_Summarizer())
        try:
            await service.compactor.set_policy("k", "", Policy(threshold_tokens=10**12))
            await scenario(service)
            remembered = await _reads(service)
            async with service.object("k") as store:
                forget_estimate(store, "")
            return remembered, await _reads(service)
        finally:
            await service.registry.close_all()

    return asyncio.run(main())


async def _import_under_missing_parent(service: SessionsService, message_id: str, parent_id: str) -> None:
    async with service.importer("k", "") as importer:
        await importer.add(_message(message_id), parent_id, 1_700_000_000_000)


def test_an_append_under_the_missing_parent_of_a_remembered_path_walks_it_again(tmp_path: Path) -> None:
    async def scenario(service: SessionsService) -> None:
        await _import_under_missing_parent(service, "b", "a")
        await service.append("k", "", _message("c"), Parent.auto(), from_client=True)
        history, _, _ = await _reads(service)  # remembered, open at "a"
        assert history == ["b", "c"]
        await service.append("k", "", _message("a"), Parent.auto(), from_client=True)  # a -> c -> b -> a

    remembered, fresh = _remembered_and_fresh(tmp_path, scenario)
    assert remembered == fresh
    assert len(fresh[0]) == MAX_PATH_DEPTH + 1 and fresh[0][-3:] == ["b", "c", "a"]


def test_an_update_on_a_path_that_passes_a_row_twice_is_seen_wherever_it_stands(tmp_path: Path) -> None:
    async def scenario(service: SessionsService) -> None:
        await _import_under_missing_parent(service, "b", "a")
        await service.append("k", "", _message("a"), Parent.of("b"), from_client=True)  # a -> b -> a
        await _reads(service)
        assert (await service.update("k", "", _message("a", "longer words " * 100), from_client=True)).changed

    remembered, fresh = _remembered_and_fresh(tmp_path, scenario)
    assert remembered == fresh
    assert len({tokens for message_id, tokens in fresh[1] if message_id == "a"}) == 1


def test_a_walk_that_raced_the_append_of_its_missing_parent_is_not_remembered(tmp_path: Path) -> None:
    """A walk read before the missing parent was appended, and kept after that append was
    noted (appends do not move the session's version): every read of its leaf then came from
    the memo without the new root, and an append under the leaf extended the stale path, so
    plain reads of the session were short too. The walk here runs on a snapshot taken before
    the append, as a reader thread's would, and is kept only after the append is noted."""

    async def main() -> tuple[list[str] | None, list[str], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await _import_under_missing_parent(service, "r0", "P")
            await service.append("k", "", _message("r1"), Parent.auto(), from_client=True)
            async with service.object("k") as store:
                stamp = paths.walk_stamp(store, "")  # as a read takes it, before its snapshot
                with contextlib.closing(sqlite3.connect(object_path(tmp_path, "k"), isolation_level=None)) as conn:
                    conn.execute("BEGIN")
                    conn.execute("SELECT count(*) FROM cf_agents_session_messages").fetchone()  # the snapshot
                    await service.append("k", "", _message("P"), Parent.root(), from_client=True)
                    walked = paths.path_stats(store, conn, "", "r1", stamp)
                    conn.execute("COMMIT")
                assert [row.id for row in walked.rows] == ["r0", "r1"] and walked.open_parent == "P"
                kept = paths.remembered_path(store, "", "r1")
            await service.append("k", "", _message("x"), Parent.of("r1"), from_client=True)
            history = [view.info.id async for window in service.history("k", "") for view in window if view.info]
            stats = [row.id for row in await service.row_stats("k", "")]
            return None if kept is None else [row.id for row in kept], history, stats
        finally:
            await service.registry.close_all()

    kept, history, stats = asyncio.run(main())
    assert kept is None
    assert history == stats == ["P", "r0", "r1", "x"]
