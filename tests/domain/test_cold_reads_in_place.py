"""A lone caller's first read of a short session after its object opened runs on the event
loop's thread whichever method asks: a budgeted read's plan (a walk when nothing is
remembered), a newest-first read's path once it meets a compaction, a message's branches, the
session's compaction records, an attachment's description, a path's row statistics, and a
small object's sessions and counts. Each read took the hop to a
worker thread before and, on a freshly opened object, a second connection, whose open reads the
schema again. The domain over a real object file."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from sessions_server.domain import service as service_module
from sessions_server.domain.history import RecentSummary
from sessions_server.domain.messages import is_overlay_id
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.domain.views import MessageView
from sessions_server.storage.rows import Parent
from tests.domain.test_root_first_plan import _message, _service, executor_reads

__all__ = ["executor_reads"]  # the fixture, used by name

T = TypeVar("T")


def _run_cold(data_dir: Path, read: Callable[[SessionsService], Awaitable[T]]) -> T:
    """`read(service)` on an object closed and opened again (nothing remembered), after m1 → m2
    → m3 → m4 with m2b a second child of m1, and a compaction record over m1..m2."""

    async def run() -> T:
        service = _service(data_dir)
        try:
            items = [AppendInput(_message(i), Parent.auto(), True) for i in ("m1", "m2", "m3", "m4")]
            await service.append_many("o", "s", items)
            await service.append_many("o", "s", [AppendInput(_message("m2b"), Parent.of("m1"), True)])
            await service.append_many("o", "s", [AppendInput(_message("m5"), Parent.of("m4"), True)])
            await service.compactor.add("o", "s", "summary of one and two", "m1", "m2")
        finally:
            await service.registry.close_all()
        service = _service(data_dir)
        try:
            return await read(service)
        finally:
            await service.registry.close_all()

    return asyncio.run(run())


def _ids(views: Sequence[MessageView]) -> list[str]:
    return [json.loads(view.json)["id"] for view in views]


def test_a_budgeted_reads_walk_runs_in_place(tmp_path: Path, executor_reads: list[str]) -> None:
    async def read(service: SessionsService) -> tuple[RecentSummary, list[str]]:
        items = [item async for item in service.recent_history("o", "s", 1_000_000)]
        summary, windows = items[0], items[1:]
        assert isinstance(summary, RecentSummary)
        return summary, [i for window in windows if isinstance(window, list) for i in _ids(window)]

    summary, ids = _run_cold(tmp_path, read)
    assert executor_reads == []
    assert not summary.truncated
    assert len(ids) == 4 and is_overlay_id(ids[0]) and ids[1:] == ["m3", "m4", "m5"]


def test_a_newest_first_reads_path_past_a_compaction_runs_in_place(tmp_path: Path, executor_reads: list[str]) -> None:
    async def read(service: SessionsService) -> list[str]:
        return [i async for window in service.history("o", "s", newest_first=True) for i in _ids(window)]

    ids = _run_cold(tmp_path, read)
    assert executor_reads == []
    assert ids[:3] == ["m5", "m4", "m3"] and len(ids) == 4 and is_overlay_id(ids[3])


def test_a_messages_branches_are_read_in_place(tmp_path: Path, executor_reads: list[str]) -> None:
    async def read(service: SessionsService) -> list[str]:
        return [i async for window in service.get_branches("o", "s", "m3") for i in _ids(window)]

    assert _run_cold(tmp_path, read) == ["m4"]
    assert executor_reads == []


def test_a_sessions_compaction_records_are_read_in_place(tmp_path: Path, executor_reads: list[str]) -> None:
    async def read(service: SessionsService) -> list[tuple[str, str]]:
        spans = await service.compactor.spans("o", "s")
        page, more = await service.compactor.records_after("o", "s", 0, 10, 1 << 20)
        assert not more and [record.id for record in page] == [span.id for span in spans]
        return [(record.from_message_id, record.to_message_id) for record in page]

    assert _run_cold(tmp_path, read) == [("m1", "m2")]
    assert executor_reads == []


def test_an_attachments_description_is_read_in_place(tmp_path: Path, executor_reads: list[str]) -> None:
    """Its chunks, up to a megabyte each, still take the executor."""
    payload = b"\x89PNG" + bytes(range(256)) * 4
    url = "data:image/png;base64," + base64.b64encode(payload).decode()
    message = {"id": "pic", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": url}]}

    async def run() -> tuple[str, bytes]:
        service = _service(tmp_path)
        try:
            await service.append("o", "s", json.dumps(message), Parent.auto(), from_client=True)
            stored = await service.get_message("o", "s", "pic", inline=False)
            assert stored is not None
            digest = json.loads(stored.json)["parts"][0]["url"].removeprefix("attachment:sha256:")
        finally:
            await service.registry.close_all()
        service = _service(tmp_path)
        try:
            executor_reads.clear()
            chunks = [chunk async for chunk in service.read_attachment("o", digest)]
            return chunks[0][0], b"".join(data for _, _, data in chunks)
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == ("image/png", payload)
    assert executor_reads == ["<lambda>"]  # the one chunk


def test_a_paths_row_statistics_are_read_in_place(tmp_path: Path, executor_reads: list[str]) -> None:
    async def read(service: SessionsService) -> list[str]:
        return [stat.id for stat in await service.row_stats("o", "s")]

    assert _run_cold(tmp_path, read) == ["m1", "m2", "m3", "m4", "m5"]
    assert executor_reads == []


@pytest.mark.parametrize("small", [True, False], ids=["small object", "large object"])
def test_a_small_objects_sessions_and_counts_are_read_in_place(
    tmp_path: Path, executor_reads: list[str], monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    """Their cost grows with the object: a large one's take the executor from the start."""
    if not small:
        monkeypatch.setattr(service_module, "IN_PLACE_MAX_OBJECT_BYTES", 0)

    async def read(service: SessionsService) -> tuple[list[tuple[str, int]], int]:
        sessions = await service.list_sessions("o", None, 10)
        counts = await service.object_stats("o")
        return sessions, counts["message_rows"]

    assert _run_cold(tmp_path, read) == ([("s", 6)], 6)  # m2b too
    assert executor_reads == ([] if small else ["<lambda>", "object_counts"])
