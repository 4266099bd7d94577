"""The path memo stays within its process-wide budgets (row stats, message bytes), and what it
serves stays right.

Runs the domain over real object files (no gRPC): several sessions read in turn under a small
budget, so remembered paths are dropped least recently used first and walked again.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import paths
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.domain.views import MessageView
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import MAX_PATH_DEPTH, Parent, PathStat, RowInfo


def _message(message_id: str) -> str:
    return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{message_id}"}}]}}'


async def _append_all(service: SessionsService, key: str, session_id: str, texts: list[str]) -> None:
    await service.append_many(key, session_id, [AppendInput(t, Parent.auto(), True) for t in texts])


async def _history_json(service: SessionsService, key: str, session_id: str) -> list[str]:
    return [view.json async for window in service.history(key, session_id) for view in window]


def _accounted() -> int:
    """The remembered paths' cost, counted afresh from what they hold."""
    return sum(paths.PATH_OVERHEAD_BYTES + sum(map(paths.row_cost, path.rows)) for path in paths._paths.values())


def _row(message_id: str) -> PathStat:
    return PathStat(message_id, "user", 0, 0)


def test_remembered_rows_stay_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 250 * paths.row_cost(_row("s0-000"))
    monkeypatch.setattr(paths, "MAX_REMEMBERED_PATH_BYTES", budget)
    monkeypatch.setattr(paths, "_paths", OrderedDict())  # what other tests left is not ours to count
    monkeypatch.setattr(paths, "_path_bytes", 0)
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))

    async def history_ids(session_id: str) -> list[str]:
        return [view.info.id async for window in service.history("budget", session_id) for view in window]

    async def scenario() -> None:
        expected: dict[str, list[str]] = {}
        for index in range(4):  # 4 sessions of 100 rows: at most two fit in the budget
            session_id = f"s{index}"
            ids = [f"{session_id}-{n:03d}" for n in range(100)]
            items = [AppendInput(_message(i), Parent.auto(), True) for i in ids]
            await service.append_many("budget", session_id, items)
            expected[session_id] = ids
        for round_ in range(3):
            for session_id, ids in expected.items():
                assert await history_ids(session_id) == ids
                assert paths._path_bytes == _accounted() <= budget
                new_id = f"{session_id}-x{round_}"
                await service.append("budget", session_id, _message(new_id), Parent.auto(), from_client=True)
                ids.append(new_id)  # extends the remembered path when it is still held
                assert paths._path_bytes == _accounted() <= budget
        assert 0 < len(paths._paths) <= 2

    asyncio.run(scenario())


def test_long_ids_and_roles_count_for_what_they_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids and roles may each take 16 KiB: a budget counted in rows held 633 MB for 20,000 such
    rows. Counted in bytes, a session of long ids takes the room of many short ones, updates
    and appends keep the count true, and reads stay right."""
    budget = 300 * paths.row_cost(_row("s0-000"))
    monkeypatch.setattr(paths, "MAX_REMEMBERED_PATH_BYTES", budget)
    monkeypatch.setattr(paths, "_paths", OrderedDict())
    monkeypatch.setattr(paths, "_path_bytes", 0)
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
    long_role = "r" * 8_000

    def long_message(message_id: str, role: str = long_role) -> str:
        return json.dumps({"id": message_id, "role": role, "parts": [{"type": "text", "text": "x"}]})

    async def history_ids(session_id: str) -> list[str]:
        return [view.info.id async for window in service.history("long", session_id) for view in window]

    async def scenario() -> None:
        short = [f"s-{n:03d}" for n in range(100)]
        await _append_all(service, "long", "short", [_message(i) for i in short])
        assert await history_ids("short") == short
        long = [f"{n:03d}-" + "i" * 8_000 for n in range(20)]  # 20 rows: over the whole budget
        await _append_all(service, "long", "long", [long_message(i) for i in long])
        assert await history_ids("long") == long
        assert paths._path_bytes == _accounted() <= budget
        assert [key[1] for key in paths._paths] == ["short"]  # the long path was too large to keep

        few = long[:5]  # within the budget, but not beside the short session's 100 rows
        await _append_all(service, "long", "few", [long_message(i) for i in few])
        assert await history_ids("few") == few
        assert paths._path_bytes == _accounted() <= budget
        assert [key[1] for key in paths._paths] == ["few"]

        # An update restates a row with a role of another length; an append extends the path.
        await service.update("long", "few", long_message(few[2], role="user"), from_client=True)
        assert paths._path_bytes == _accounted() <= budget
        few.append("after")
        await service.append("long", "few", long_message("after", role="user"), Parent.auto(), from_client=True)
        assert paths._path_bytes == _accounted() <= budget
        assert [key[1] for key in paths._paths] == ["few"] and await history_ids("few") == few

        # Updates alone (an agent rewriting its messages) that lengthen roles keep to the budget
        # too: the remembered paths are trimmed, and a path grown past all of it is dropped.
        assert await history_ids("short") == short
        for message_id in short[:50]:
            await service.update("long", "short", long_message(message_id), from_client=True)
            assert paths._path_bytes == _accounted() <= budget
        assert "short" not in [key[1] for key in paths._paths]
        assert await history_ids("short") == short

    asyncio.run(scenario())


def _views_accounted() -> int:
    return sum(held.bytes for held in paths._views.values())


def _paths_in_order_consistent() -> bool:
    """A remembered path keeps its messages in order only while its session's messages are
    held (else dropping them would free nothing), one per row."""
    return all(
        path.views is None or (key in paths._views and len(path.views) == len(path.rows))
        for key, path in paths._paths.items()
    )


def test_remembered_messages_stay_within_the_budget(tmp_path: Path, fresh_memo: pytest.MonkeyPatch) -> None:
    """Under a small byte budget, sessions' messages are dropped least recently used first and
    read again from storage; what every read returns stays right, and a path too large for a
    session's share is streamed without being remembered at all."""
    one = paths.view_cost(_view(_message("s0-000")))
    fresh_memo.setattr(paths, "MAX_VIEW_BYTES", 250 * one)
    fresh_memo.setattr(paths, "MAX_SESSION_VIEW_BYTES", 150 * one)
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))

    async def scenario() -> None:
        expected: dict[str, list[str]] = {}
        for index in range(4):  # 4 sessions of 100 messages: at most two fit in the budget
            session_id = f"s{index}"
            texts = [_message(f"{session_id}-{n:03d}") for n in range(100)]
            await _append_all(service, "views", session_id, texts)
            expected[session_id] = texts
        for round_ in range(3):
            for session_id, texts in expected.items():
                assert await _history_json(service, "views", session_id) == texts
                assert await _history_json(service, "views", session_id) == texts  # in order, in memory
                assert paths._view_bytes == _views_accounted() <= paths.MAX_VIEW_BYTES
                assert any(key[1] == session_id and path.views for key, path in paths._paths.items())
                text = _message(f"{session_id}-x{round_}")
                await service.append("views", session_id, text, Parent.auto(), from_client=True)
                texts.append(text)
                assert paths._view_bytes == _views_accounted() <= paths.MAX_VIEW_BYTES
                assert _paths_in_order_consistent()
        assert 0 < len(paths._views) <= 2

        big = [_message(f"big-{n:03d}") for n in range(200)]  # over the session's share
        await _append_all(service, "views", "big", big)
        before = dict(paths._views)
        assert await _history_json(service, "views", "big") == big
        assert all(key[1] != "big" for key in paths._views)
        assert paths._views == before  # streaming it evicted nobody

    asyncio.run(scenario())


def _view(text: str, message_id: str = "x") -> MessageView:
    return MessageView(RowInfo(message_id, "user", None, 1, 0, 1), text)


def test_a_session_outgrowing_its_share_is_forgotten(tmp_path: Path, fresh_memo: pytest.MonkeyPatch) -> None:
    one = paths.view_cost(_view(_message("grow-000")))
    fresh_memo.setattr(paths, "MAX_SESSION_VIEW_BYTES", 50 * one)
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))

    async def scenario() -> None:
        texts = [_message(f"grow-{n:03d}") for n in range(40)]
        await _append_all(service, "grow", "", texts)
        assert await _history_json(service, "grow", "") == texts
        assert await _history_json(service, "grow", "") == texts
        assert len(paths._views) == 1
        assert any(path.views for path in paths._paths.values())  # the second read kept them in order
        for n in range(40, 60):  # appends are remembered until the session passes its share
            texts.append(_message(f"grow-{n:03d}"))
            await service.append("grow", "", texts[-1], Parent.auto(), from_client=True)
            assert paths._view_bytes == _views_accounted() <= paths.MAX_SESSION_VIEW_BYTES
            assert _paths_in_order_consistent()
        assert len(paths._views) == 0
        assert await _history_json(service, "grow", "") == texts
        assert len(paths._views) == 0  # and it is not taken up again while it is too large

    asyncio.run(scenario())


def test_messages_read_before_a_change_are_not_remembered_after_it(tmp_path: Path) -> None:
    """A read that raced with an update (or any change that forgets the session) must not store
    what it read: the version it started under is stale."""
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))

    async def scenario() -> None:
        await service.append("race", "", _message("r1"), Parent.auto(), from_client=True)
        async with service.object("race") as store:
            _, _, version = paths.remembered_views(store, "", ["r1"])
            stale = _view(_message("r1"), "r1")
            paths.forget(store, "")  # e.g. an update committed while the read ran
            paths.remember_views(store, "", version, [stale])
            assert paths.remembered_views(store, "", ["r1"])[:2] == ([None], ["r1"])
            _, _, current = paths.remembered_views(store, "", ["r1"])
            paths.remember_views(store, "", current, [stale])
            assert paths.remembered_views(store, "", ["r1"])[:2] == ([stale], [])  # a current read is kept

    asyncio.run(scenario())


def test_a_zero_message_budget_remembers_nothing_and_reads_stay_right(
    tmp_path: Path, fresh_memo: pytest.MonkeyPatch
) -> None:
    """`--message-memo-bytes 0`: every read comes from storage."""
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))

    async def scenario() -> None:
        texts = [_message(f"z-{n:02d}") for n in range(30)]
        await _append_all(service, "zero", "", texts)
        assert await _history_json(service, "zero", "") == texts
        assert len(paths._views) == 1
        paths.set_message_budget(0)  # drops what it held
        assert len(paths._views) == 0 and paths._view_bytes == 0
        texts.append(_message("z-30"))
        await service.append("zero", "", texts[-1], Parent.auto(), from_client=True)
        for _ in range(2):
            assert await _history_json(service, "zero", "") == texts
            assert len(paths._views) == 0

    asyncio.run(scenario())


def test_a_path_at_the_depth_cap_keeps_its_messages_in_step(tmp_path: Path, fresh_memo: pytest.MonkeyPatch) -> None:
    """At the depth cap an append pushes the oldest row out of the remembered path: the
    messages kept in path order must lose theirs too, and reads stay right."""
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
    cap_rows = MAX_PATH_DEPTH + 1

    async def scenario() -> None:
        ids = [f"c{n:05d}" for n in range(cap_rows)]
        for start in range(0, cap_rows, 2_000):
            await _append_all(service, "cap", "", [_message(i) for i in ids[start : start + 2_000]])
        for _ in range(2):  # the second read keeps the path's messages in order
            assert [json.loads(text)["id"] for text in await _history_json(service, "cap", "")] == ids
        (path,) = paths._paths.values()
        assert path.views is not None
        for n in range(3):
            ids.append(f"d{n}")
            await service.append("cap", "", _message(ids[-1]), Parent.auto(), from_client=True)
            assert path.views is not None and len(path.views) == len(path.rows) == cap_rows
            read = [json.loads(text)["id"] for text in await _history_json(service, "cap", "")]
            assert read == ids[-cap_rows:]

    asyncio.run(scenario())


def test_a_remembered_message_counts_what_its_text_takes_in_memory() -> None:
    """Text and encoding both: one emoji in ASCII JSON makes CPython keep 4 bytes a character,
    which the memo counted as 1 (the audit's emoji messages held 2.2 times the budget)."""
    ascii_text = _message("x" * 100_000)
    wide_text = ascii_text[:-4] + "😀" + ascii_text[-4:]
    ascii_cost, wide_cost = paths.view_cost(_view(ascii_text)), paths.view_cost(_view(wide_text))
    assert ascii_cost >= 2 * len(ascii_text)
    assert wide_cost >= 4 * len(wide_text) + len(wide_text.encode())
