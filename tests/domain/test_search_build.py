"""The first search builds the object's index in steps: the object's other writes wait for one
step, not for the whole build (a million messages took 243 s, every write to the object waiting),
writes between steps are indexed once, and a build cut short goes on from where it stood.

Runs the domain over real object files (no gRPC), with one message per step (no time for more).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import search_index
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import queries
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from sessions_server.storage.store import WriteContext
from tests.domain.searching import search


def _message(message_id: str, text: str | None = None) -> str:
    body = text if text is not None else f"words of {message_id}"
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": body}]})


def _index_rows(path: Path) -> Counter[tuple[str, str, str]]:
    with sqlite3.connect(path) as conn:
        return Counter(
            (str(r[0]), str(r[1]), str(r[2]))
            for r in conn.execute("SELECT session_id, id, content FROM cf_agents_session_fts")
        )


@pytest.fixture(autouse=True)
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_index, "BACKFILL_STEP_SECONDS", 0.0)  # one page a step
    monkeypatch.setattr(queries, "BACKFILL_PAGE_ROWS", 40)


async def _service(tmp_path: Path) -> tuple[SessionsService, ObjectRegistry, ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4)
    registry = ObjectRegistry(tmp_path, executor, calls_in_flight=lambda: 5)  # jobs on threads
    service = SessionsService(registry)
    for session_id in ("a", "b"):
        items = [AppendInput(_message(f"{session_id}{i:03d}"), Parent.auto(), True) for i in range(100)]
        await service.append_many("k", session_id, items)
    return service, registry, executor


def test_writes_between_steps_are_indexed_once_and_the_index_ends_exact(tmp_path: Path) -> None:
    async def scenario() -> int:
        service, registry, executor = await _service(tmp_path)
        steps = 0
        try:
            async with registry.use("k") as store:
                await store.write(search_index.start_index)
                store.search_index_committed()
                assert await store.write(search_index.backfill_step) is False
                steps += 1
                # Between steps: a new message, an update and a delete ahead of the backfill, an
                # update behind it.
                await service.append_many("k", "a", [AppendInput(_message("a-new"), Parent.auto(), True)])
                await service.update("k", "b", _message("b090", "changed words"), from_client=True)
                assert await service.delete("k", "b", ["b091"]) == 1
                await service.update("k", "a", _message("a001", "changed early"), from_client=True)
                while not await store.write(search_index.backfill_step):
                    steps += 1
                assert await store.read(queries.backfill_under_way) is None
            hits = await search(service, "k", "b", "changed words")
            assert [hit.id for hit in hits] == ["b090"]
            return steps
        finally:
            await registry.close_all()
            executor.shutdown()

    steps = asyncio.run(scenario())
    assert steps >= 4  # one message a step here: the build ran in many write jobs
    expected = Counter(
        [("a", f"a{i:03d}", f"words of a{i:03d}") for i in range(100) if i != 1]
        + [("b", f"b{i:03d}", f"words of b{i:03d}") for i in range(100) if i not in (90, 91)]
        + [("a", "a-new", "words of a-new"), ("b", "b090", "changed words"), ("a", "a001", "changed early")]
    )
    assert _index_rows(object_path(tmp_path, "k")) == expected


def test_a_write_during_the_build_waits_for_one_step_not_for_the_build(tmp_path: Path) -> None:
    entered, proceed = threading.Event(), threading.Event()
    step = search_index.backfill_step
    calls = 0

    def held_step(ctx: WriteContext) -> bool:
        nonlocal calls
        calls += 1
        if calls == 2:
            entered.set()
            assert proceed.wait(timeout=30), "the step was never let go"
        return step(ctx)

    async def scenario() -> tuple[bool, list[str]]:
        service, registry, executor = await _service(tmp_path)
        try:
            search_index.backfill_step = held_step  # type: ignore[assignment]
            searching = asyncio.ensure_future(search(service, "k", "a", "a050"))
            await asyncio.to_thread(entered.wait, 30)  # the second step holds the writer
            appending = asyncio.ensure_future(
                service.append_many("k", "a", [AppendInput(_message("a-late"), Parent.auto(), True)])
            )
            async with registry.use("k") as store:
                for _ in range(10_000):  # until the append is queued behind the step
                    if store._queue:
                        break
                    await asyncio.sleep(0)
                assert store._queue
            proceed.set()
            await appending
            build_went_on = not searching.done()
            hits = await searching
            return build_went_on, [hit.id for hit in hits]
        finally:
            search_index.backfill_step = step  # type: ignore[assignment]
            proceed.set()
            await registry.close_all()
            executor.shutdown()

    build_went_on, hits = asyncio.run(scenario())
    assert build_went_on  # the append was answered while the index was still being built
    assert hits == ["a050"]


def test_a_build_cut_short_goes_on_from_where_it_stood(tmp_path: Path) -> None:
    step = search_index.backfill_step
    calls = 0

    class CutShort(Exception):
        pass

    def failing_third(ctx: WriteContext) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise CutShort
        return step(ctx)

    async def scenario() -> tuple[queries.Backfill | None, list[str]]:
        service, registry, executor = await _service(tmp_path)
        try:
            search_index.backfill_step = failing_third  # type: ignore[assignment]
            with pytest.raises(CutShort):
                await search(service, "k", "b", "b099")
            search_index.backfill_step = step  # type: ignore[assignment]
            await registry.close_object("k")  # as a restart would: a new store, nothing in memory
            async with registry.use("k") as store:
                stood = await store.read(queries.backfill_under_way)
            hits = await search(service, "k", "b", "b099")
            return stood, [hit.id for hit in hits]
        finally:
            search_index.backfill_step = step  # type: ignore[assignment]
            await registry.close_all()
            executor.shutdown()

    stood, hits = asyncio.run(scenario())
    assert stood is not None and stood.after is not None  # two steps done, recorded
    assert hits == ["b099"]
    rows = _index_rows(object_path(tmp_path, "k"))
    assert sum(rows.values()) == 200 and max(rows.values()) == 1  # every message once


def test_the_backfill_indexes_in_key_order_whatever_each_message_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of plain messages are indexed a statement a run, a message with continuation rows or
    without its writer's stamp by itself, and all in key order, as upstream's one statement
    does (the index's rowids break ties in ranking)."""
    monkeypatch.setattr(search_index, "RUN_BYTES", 300)  # runs of a few messages

    async def scenario() -> None:
        executor = ThreadPoolExecutor(max_workers=2)
        registry = ObjectRegistry(tmp_path, executor)
        service = SessionsService(registry)
        try:
            texts = {f"m{i:02d}": f"shared words {i}" for i in range(12)}
            texts["m04"] = "shared words " + "long " * 400_000  # over a row: continuation rows
            items = [AppendInput(_message(message_id, text), Parent.auto(), True) for message_id, text in texts.items()]
            await service.append_many("k", "", items)
            async with registry.use("k") as store:
                await store.write(
                    lambda ctx: ctx.conn.execute(
                        "UPDATE cf_agents_session_messages SET content_hash = NULL WHERE id = 'm07'"
                    )
                )
            assert len(await search(service, "k", "", "shared", limit=-1)) == 12
        finally:
            await registry.close_all()
            executor.shutdown()

    asyncio.run(scenario())
    with sqlite3.connect(object_path(tmp_path, "k")) as conn:
        ids = [str(r[0]) for r in conn.execute("SELECT id FROM cf_agents_session_fts ORDER BY rowid")]
    assert ids == [f"m{i:02d}" for i in range(12)]


def test_a_message_with_continuation_rows_is_backfilled_as_its_write_indexes_it(tmp_path: Path) -> None:
    """Upstream's backfill skips such a message; ours indexes it with the text its write would
    index (read in Python, not by SQLite's JSON functions, which held about 28 times its size):
    the same message written before and after the index exists gets the same index row."""
    parts = [
        {"type": "text", "text": "first " * 300_000},  # over a row: continuation rows
        {"type": "text", "text": ""},
        {"type": "reasoning", "text": "not indexed"},
        {"type": "text", "text": "last words"},
    ]

    def message(message_id: str) -> str:
        return json.dumps({"id": message_id, "role": "user", "parts": parts})

    async def scenario() -> None:
        executor = ThreadPoolExecutor(max_workers=2)
        registry = ObjectRegistry(tmp_path, executor)
        service = SessionsService(registry)
        try:
            await service.append("k", "", message("before"), Parent.auto(), from_client=True)
            assert len(await search(service, "k", "", "last", limit=-1)) == 1  # the backfill
            await service.append("k", "", message("after"), Parent.auto(), from_client=True)
            assert len(await search(service, "k", "", "last", limit=-1)) == 2
        finally:
            await registry.close_all()
            executor.shutdown()

    asyncio.run(scenario())
    with sqlite3.connect(object_path(tmp_path, "k")) as conn:
        texts = dict(conn.execute("SELECT id, CAST(content AS BLOB) FROM cf_agents_session_fts"))
    assert texts["before"] == texts["after"]
