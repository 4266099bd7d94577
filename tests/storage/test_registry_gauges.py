"""The registry's gauges (open bytes, row writes, subscribers) are read by the metrics endpoint's
thread while the event loop keeps reordering the open objects (every request moves its object to
the end of the LRU). A sum must not fail when that happens midway."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.storage.registry import ObjectRegistry


def test_gauges_survive_the_lru_being_reordered_while_they_sum(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int, int, int]:
        executor = ThreadPoolExecutor(max_workers=2)
        registry = ObjectRegistry(tmp_path, executor)
        try:
            for key in ("a", "b", "c"):
                async with registry.use(key):
                    pass
            first = registry._open["a"]
            measure = first.file_bytes

            def measured_while_a_request_reorders() -> int:
                registry._open.move_to_end("b")  # what `use("b")` does on the event loop
                return measure()

            first.file_bytes = measured_while_a_request_reorders  # type: ignore[method-assign]
            sizes = registry.open_bytes()
            return sizes, registry.row_writes(), registry.subscriber_count(), registry.open_count
        finally:
            await registry.close_all()
            executor.shutdown()

    open_bytes, row_writes, subscribers, open_count = asyncio.run(scenario())
    assert open_bytes > 0
    assert (row_writes, subscribers, open_count) == (0, 0, 3)
