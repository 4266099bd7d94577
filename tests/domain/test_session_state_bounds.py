"""What an open object remembers per session stays bounded however many sessions it sees, and
what it remembers of an object goes when the object closes.

An object stays open as long as it is in use (within `--max-open-objects`), so an object that
sees ever new sessions (one per conversation, say) kept an entry per session in each of its
caches: the path memo's versions, the writer's tails, the compaction facts (policies, token
estimates). A soak of 4,000 sessions created and cleared in one object
grew the server by 13 MB, kept after the sessions were gone. And the path memo kept the paths
and messages of closed objects until newer entries pushed them out (12,587 sessions' of 12 open
objects). Runs the domain over real object files (no gRPC).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import compactor, paths
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import store as store_module
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]})


def test_per_session_state_of_an_open_object_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "MAX_VERSIONED_SESSIONS", 5)
    monkeypatch.setattr(store_module, "MAX_CACHED_TAILS", 5)
    monkeypatch.setattr(compactor, "MAX_REMEMBERED_SESSION_FACTS", 5)

    async def scenario() -> None:
        executor = ThreadPoolExecutor(max_workers=2)
        registry = ObjectRegistry(tmp_path, executor)
        service = SessionsService(registry)
        try:
            sessions = [f"s{i:02d}" for i in range(20)]
            for session_id in sessions:
                await service.append_many("k", session_id, [AppendInput(_message("a"), Parent.auto(), True)])
                await service.compactor.get_policy("k", session_id)
            async with registry.use("k") as store:
                before = paths.session_version(store, "s00")
            for session_id in sessions:
                await service.clear("k", session_id)
                await service.append_many("k", session_id, [AppendInput(_message("b"), Parent.auto(), True)])
            for session_id in sessions:  # every tail let go is read again: appends land on "b"
                await service.append_many("k", session_id, [AppendInput(_message("c"), Parent.auto(), True)])
                read = service.history("k", session_id)
                history = [(view.info.id, view.info.parent_id) async for window in read for view in window]
                assert history == [("b", None), ("c", "b")]
            async with registry.use("k") as store:
                memo = paths._object_memo(store)
                assert len(memo.versions) <= 5
                assert len(store._tails) <= 5
                assert len(compactor._facts(store)) <= 5
                # s00 changed after `before` was taken: whatever was let go since, it never reads
                # as that version again (a walk taken at it would not be remembered).
                assert paths.session_version(store, "s00") != before
        finally:
            await registry.close_all()
            executor.shutdown()

    asyncio.run(scenario())


def test_what_the_path_memo_holds_of_an_object_goes_when_it_closes(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int]:
        executor = ThreadPoolExecutor(max_workers=2)
        registry = ObjectRegistry(tmp_path, executor)
        service = SessionsService(registry)
        try:
            for key in ("closing", "staying"):
                for session_id in ("x", "y"):
                    items = [AppendInput(_message(f"m{i}"), Parent.auto(), True) for i in range(3)]
                    await service.append_many(key, session_id, items)
                    assert len([v async for w in service.history(key, session_id) for v in w]) == 3
            async with registry.use("closing") as store:
                closing = paths._object_memo(store)
            async with registry.use("staying") as store:
                staying = paths._object_memo(store)
            assert {k[1] for k in paths._paths if k[0] is closing} == {"x", "y"}
            await registry.close_object("closing")
            left = [k for k in (*paths._paths, *paths._views) if k[0] is closing]
            kept = [k for k in (*paths._paths, *paths._views) if k[0] is staying]
            return len(left), len(kept)
        finally:
            await registry.close_all()
            executor.shutdown()

    left, kept = asyncio.run(scenario())
    assert left == 0
    assert kept >= 2
