"""A read holds the summaries of the overlays it sends, not every summary of the session.

Every path read loaded all of a session's compaction records, summaries included, and held them
for the whole read: 300 records of 1 MiB made a newest-first read of one small message take the
server's memory up by 335 MiB, and a remembered overlay plan kept them all while its path was
remembered. Reads now plan with records without summaries (`queries.compaction_spans`) and read
a summary by id as its overlay is sent; planning a compaction reads the summaries its prompt
extends, the session estimate those of applied overlays, and a page of ListCompactions those of
its records.

Counted where storage hands rows to Python: every statement of every object connection is
watched for the summaries' texts (each names its record), so a summary read by any query counts.
The domain over real object files, no gRPC.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import paths
from sessions_server.domain.errors import LimitExceeded
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.domain.tokens import estimate_string_tokens
from sessions_server.storage import queries
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import COMPACTION_PREFIX, Parent
from tests.domain.test_compaction_plan_reads import _count_renderings

KEY = "o"
MARK = "summary-of-record-"
SUMMARY_FILL = 20_000
# Records 0..19 all cover m1..m2 (the newest, 19, applies); record 20 covers m4..m5.
SAME_SPAN_RECORDS = 20
APPLIED = [19, 20]


def _summary(record: int) -> str:
    return f"{MARK}{record}:" + "s" * SUMMARY_FILL


class _Cursor:
    """A cursor whose rows are looked at for summaries as they are handed out."""

    def __init__(self, cursor: Any, reads: SummaryReads) -> None:
        self._cursor = cursor
        self._reads = reads

    def __iter__(self) -> Iterator[Any]:
        for row in self._cursor:
            self._reads.note(row)
            yield row

    def fetchone(self) -> Any:
        row = self._cursor.fetchone()
        self._reads.note(row)
        return row

    def fetchall(self) -> list[Any]:
        rows = self._cursor.fetchall()
        for row in rows:
            self._reads.note(row)
        return rows

    def fetchmany(self, *args: Any) -> list[Any]:
        rows = self._cursor.fetchmany(*args)
        for row in rows:
            self._reads.note(row)
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class SummaryReads:
    """The records whose summaries storage handed to Python, in order, since the last `take`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.records: list[int] = []
        original = queries.ObjectConnection.execute
        reads = self

        def execute(conn: Any, *args: Any, **kwargs: Any) -> Any:
            return _Cursor(original(conn, *args, **kwargs), reads)

        monkeypatch.setattr(queries.ObjectConnection, "execute", execute)

    def note(self, row: Sequence[Any] | None) -> None:
        for value in row or ():
            if isinstance(value, str) and value.startswith(MARK):
                self.records.append(int(value[len(MARK) : value.index(":")]))

    def take(self) -> list[int]:
        taken, self.records = self.records, []
        return taken


def _message(index: int) -> str:
    return json.dumps({"id": f"m{index}", "role": "user", "parts": [{"type": "text", "text": f"turn {index} " * 20}]})


def _run(tmp_path: Path, scenario: Callable[[SessionsService], Awaitable[None]], *, messages: int = 12) -> None:
    async def main() -> None:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append_many(KEY, "", [AppendInput(_message(i), Parent.auto(), True) for i in range(messages)])
            ids = []
            for record in range(SAME_SPAN_RECORDS):
                ids.append((await service.compactor.add(KEY, "", _summary(record), "m1", "m2")).id)
            ids.append((await service.compactor.add(KEY, "", _summary(SAME_SPAN_RECORDS), "m4", "m5")).id)
            async with service.object(KEY) as store:  # reads start cold: nothing remembered
                paths.forget(store, "")
            await scenario(service)
        finally:
            await service.registry.close_all()

    asyncio.run(main())


async def _read(windows: Any) -> list[tuple[str, str]]:
    """(id, text) of each message read."""
    out = []
    async for window in windows:
        for view in window:
            message = json.loads(view.json)
            out.append((message["id"], message["parts"][0]["text"]))
    return out


def _overlays(read: list[tuple[str, str]]) -> list[int]:
    """The records the overlays of a read were made of, by their texts."""
    return [
        int(text[len(MARK) : text.index(":")]) for message_id, text in read if message_id.startswith(COMPACTION_PREFIX)
    ]


def test_path_reads_read_the_summaries_of_the_overlays_they_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = SummaryReads(monkeypatch)

    async def scenario(service: SessionsService) -> None:
        newest_one = await _read(service.history(KEY, "", newest_first=True, limit=1))
        assert [message_id for message_id, _ in newest_one] == ["m11"]
        assert reads.take() == []  # no overlay sent: no summary read

        for _ in range(2):  # walked, then remembered (its overlay plan too)
            root_first = await _read(service.history(KEY, ""))
            assert _overlays(root_first) == APPLIED
            assert reads.take() == APPLIED

        newest = await _read(service.history(KEY, "", newest_first=True))
        assert _overlays(newest) == APPLIED[::-1]
        assert [message_id for message_id, _ in newest] == [message_id for message_id, _ in root_first][::-1]
        assert reads.take() == APPLIED[::-1]

        items = [item async for item in service.recent_history(KEY, "", 10_000_000)]
        recent = [json.loads(view.json)["id"] for window in items[1:] for view in window]  # type: ignore[union-attr]
        assert recent == [message_id for message_id, _ in root_first]
        assert reads.take() == APPLIED
        items = [item async for item in service.recent_history(KEY, "", 10)]  # the leaf alone
        assert reads.take() == []

    _run(tmp_path, scenario)


def test_a_remembered_overlay_plan_holds_no_summary(tmp_path: Path) -> None:
    async def scenario(service: SessionsService) -> None:
        for _ in range(2):  # walked and remembered, then its overlays planned and remembered
            assert _overlays(await _read(service.history(KEY, ""))) == APPLIED
        async with service.object(KEY) as store:
            held = paths._paths.get((paths._object_memo(store), ""))
        assert held is not None and held.overlays is not None
        assert [span.compaction.id for span in held.overlays.spans] == [
            record.id for record in await service.compactor.spans(KEY, "") if record.seq - 1 in APPLIED
        ]
        for span in held.overlays.spans:
            assert not hasattr(span.compaction, "summary")

    _run(tmp_path, scenario)


def test_the_session_estimate_reads_the_summaries_of_applied_overlays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = SummaryReads(monkeypatch)

    async def scenario(service: SessionsService) -> None:
        async with service.object(KEY) as store:
            estimate = await service.compactor.token_estimate(store, "")
        assert sorted(reads.take()) == APPLIED
        stats = await service.row_stats(KEY, "")
        # The rows outside the overlays, and each applied summary's estimate (as upstream's).
        counted = sum(stat.token_estimate for stat in stats if stat.id not in {"m1", "m2", "m4", "m5"})
        assert estimate == counted + sum(estimate_string_tokens(_summary(record)) for record in APPLIED)

    _run(tmp_path, scenario)


def test_planning_reads_the_summaries_its_prompt_extends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = SummaryReads(monkeypatch)

    async def scenario(service: SessionsService) -> None:
        plan = await service.compactor.plan(KEY, "", keep_recent_tokens=1)
        assert plan is not None
        # History: m0 C19 m3 C20 m6..m11; the span extends C19 (from m1) over C20 to m9.
        assert (plan.from_message_id, plan.to_message_id) == ("m1", "m9")
        assert plan.prompt.index(_summary(19)) < plan.prompt.index(_summary(20)) < plan.prompt.index("turn 3 ")
        assert set(reads.take()) == set(APPLIED)  # each as its overlay is read, and for the prompt

    _run(tmp_path, scenario)


def test_previous_summaries_count_against_the_prompt_bound_before_the_span_is_rendered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = _count_renderings(monkeypatch)

    async def scenario(service: SessionsService) -> None:
        with pytest.raises(LimitExceeded) as refused:
            await service.compactor.plan(KEY, "", keep_recent_tokens=1, max_prompt_bytes=SUMMARY_FILL + 1_000)
        assert refused.value.metadata == {"limit": "max_response_bytes", "limit_value": str(SUMMARY_FILL + 1_000)}
        assert rendered == []  # the two summaries alone pass the bound

    _run(tmp_path, scenario)


def test_a_page_of_records_reads_the_summaries_of_its_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = SummaryReads(monkeypatch)

    async def scenario(service: SessionsService) -> None:
        page, more = await service.compactor.records_after(KEY, "", 0, 5, 1 << 30)
        assert [record.summary for record in page] == [_summary(record) for record in range(5)] and more
        assert reads.take() == [0, 1, 2, 3, 4]  # not the sixth's, which only tells that more follow
        page, more = await service.compactor.records_after(KEY, "", page[-1].seq, 100, 3 * SUMMARY_FILL + 1_000)
        assert [record.summary for record in page] == [_summary(record) for record in range(5, 8)] and more
        assert reads.take() == [5, 6, 7, 8]  # the fourth passes the bytes: read to know, then dropped
        page, more = await service.compactor.records_after(KEY, "", 18, 100, 1 << 30)
        assert [record.seq for record in page] == [19, 20, 21] and not more
        assert reads.take() == [18, 19, 20]

    _run(tmp_path, scenario)
