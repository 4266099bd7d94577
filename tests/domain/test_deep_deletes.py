"""A delete re-parents each surviving child to its nearest surviving ancestor however many of its
ancestors go. The climb stopped at the path cap (10,000 steps, as upstream's does): a child
above more deleted ancestors kept the id of a deleted parent, and a later append of a message
with that id, under the child as the newest row, made the two each other's parent.

Runs the domain over real object files (no gRPC)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import MAX_PATH_DEPTH, Parent

CHAIN = MAX_PATH_DEPTH + 3  # m0 .. m10002


def _message(message_id: str) -> str:
    return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{message_id}"}}]}}'


def test_a_child_above_more_deleted_ancestors_than_the_path_cap_goes_to_the_nearest_survivor(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, str | None, list[str], list[str]]:
        executor = ThreadPoolExecutor(max_workers=2)
        registry = ObjectRegistry(tmp_path, executor)
        service = SessionsService(registry)
        try:
            for start in range(0, CHAIN, 1000):
                batch = [
                    AppendInput(_message(f"m{i}"), Parent.auto(), True) for i in range(start, min(start + 1000, CHAIN))
                ]
                await service.append_many("k", "", batch)
            deleted = await service.delete("k", "", [f"m{i}" for i in range(1, CHAIN - 1)])
            child = await service.get_message("k", "", f"m{CHAIN - 1}")
            assert child is not None and child.info is not None
            again = await service.append("k", "", _message(f"m{CHAIN - 2}"), Parent.auto(), from_client=True)
            assert again.inserted
            history = [view.info.id async for window in service.history("k", "") for view in window if view.info]
            stats = [row.id for row in await service.row_stats("k", "")]
            return deleted, child.info.parent_id, history, stats
        finally:
            await registry.close_all()
            executor.shutdown()

    deleted, parent, history, stats = asyncio.run(scenario())

    assert deleted == CHAIN - 2
    assert parent == "m0"
    assert history == stats == ["m0", f"m{CHAIN - 1}", f"m{CHAIN - 2}"]
