"""A search's hits carry their texts a bounded window at a time: the hits are ranked in one read,
and their texts follow in windows of at most 50 hits that stop once past 4 MiB. Every text was
read in the ranking read and held until the last response: a `limit: -1` search of messages of
20 MB held 1 GB (a thousand hits could be 20 GB) before its first response. The domain over a
real object file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import service as service_module
from sessions_server.domain.history import WINDOW_BYTES
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import store as store_module
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent

TEXT_BYTES = 1_500_000


def test_search_hits_come_in_windows_that_stop_past_4_mib(tmp_path: Path) -> None:
    texts = {f"m{index}": f"common {index} " + "x" * TEXT_BYTES for index in range(7)}

    async def run() -> list[list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            messages = [
                json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})
                for message_id, text in texts.items()
            ]
            await service.append_many("o", "", [AppendInput(message, Parent.auto(), True) for message in messages])
            windows = []
            async for window in service.search_windows("o", "", "common", limit=-1):
                assert all(hit.content == texts[hit.id] for hit in window)
                windows.append([hit.id for hit in window])
            return windows
        finally:
            await service.registry.close_all()

    windows = asyncio.run(run())
    assert 2 * TEXT_BYTES < WINDOW_BYTES < 3 * TEXT_BYTES
    assert [len(window) for window in windows] == [3, 3, 1]
    assert sorted(hit for window in windows for hit in window) == sorted(texts)


@pytest.mark.parametrize(
    ("calls", "max_object_bytes", "in_place"),
    [(lambda: 1, None, 2), (lambda: 2, None, 0), (lambda: 1, 0, 1)],
    ids=["lone caller", "another call", "lone caller, large object"],
)
def test_a_lone_callers_search_of_a_small_object_is_read_in_place(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    calls: Callable[[], int],
    max_object_bytes: int | None,
    in_place: int,
) -> None:
    """A small object's ranking, and the texts of a window of hits (point reads by rowid): for a
    lone caller both run on the event loop's thread, as a walk's steps do, without the hop to a
    worker thread and back; with another call in flight, both take the hop. A large object's
    ranking takes the hop from the start (its texts are still point reads)."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)  # however slowly this machine reads
    if max_object_bytes is not None:
        monkeypatch.setattr(service_module, "IN_PLACE_MAX_OBJECT_BYTES", max_object_bytes)

    async def run() -> tuple[list[tuple[str, str]], int]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2), calls_in_flight=calls))
        try:
            messages = [
                json.dumps({"id": f"m{index}", "role": "user", "parts": [{"type": "text", "text": f"word {index}"}]})
                for index in range(3)
            ]
            await service.append_many("o", "", [AppendInput(message, Parent.auto(), True) for message in messages])
            async for _ in service.search_windows("o", "", "word"):  # builds the index
                pass
            async with service.registry.use("o") as store:
                before = store.inline_reads
                hits = [
                    (hit.id, hit.content)
                    async for window in service.search_windows("o", "", "word 1")
                    for hit in window
                ]
                return hits, store.inline_reads - before
        finally:
            await service.registry.close_all()

    hits, read_in_place = asyncio.run(run())
    assert hits == [("m1", "word 1")]
    assert read_in_place == in_place


def test_a_hit_updated_after_the_ranking_keeps_its_place_while_it_still_matches(tmp_path: Path) -> None:
    """The ranking read finds a hit by its index row; its text follows in a later read. A
    message updated in between had a new index row, and the hit was dropped: a search over
    messages an agent was streaming into by upserts came back short (42 of 60)."""

    def message(message_id: str, text: str) -> str:
        return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})

    async def run() -> tuple[list[tuple[str, str]], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            batch = [
                AppendInput(message(f"m{index:02d}", f"alpha {index}"), Parent.auto(), True) for index in range(60)
            ]
            await service.append_many("o", "", batch)
            hits = []
            windows = service.search_windows("o", "", "alpha", limit=-1)
            hits += [(hit.id, hit.content) for hit in await anext(windows)]
            later = [f"m{index:02d}" for index in range(60) if f"m{index:02d}" not in dict(hits)]
            await service.update("o", "", message(later[0], "alpha, streamed on"), from_client=True)
            await service.update("o", "", message(later[1], "no longer a match"), from_client=True)
            async for window in windows:
                hits += [(hit.id, hit.content) for hit in window]
            return hits, later
        finally:
            await service.registry.close_all()

    hits, later = asyncio.run(run())
    found = dict(hits)
    assert len(hits) == 59 and len(found) == 59
    assert found[later[0]] == "alpha, streamed on"
    assert later[1] not in found
