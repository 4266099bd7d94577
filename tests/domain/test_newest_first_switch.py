"""A newest-first walk switches to overlays at the first row that ends a compaction, and reads
the rest of the path (the overlay and what is older) in a read of its own. The domain over real
object files, no gRPC; each object is reopened first, so the walk has nothing remembered."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": f"t {message_id}"}]})


def _service(tmp_path: Path) -> SessionsService:
    return SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))


async def _write(tmp_path: Path, ids: list[str], span: tuple[str, str], after: list[str]) -> None:
    service = _service(tmp_path)
    try:
        for message_id in ids:
            await service.append("k", "", _message(message_id), Parent.auto(), from_client=False)
        await service.compactor.add("k", "", "the summary", *span)
        for message_id in after:
            await service.append("k", "", _message(message_id), Parent.auto(), from_client=False)
    finally:
        await service.registry.close_all()  # its memo of the path goes with it


def test_a_branch_appended_during_a_walk_does_not_cut_the_walk_short(tmp_path: Path) -> None:
    """The rest of the path was read from the active leaf as it was by then. Another caller's
    append on a branch that does not hold the switching row (the new active leaf) made that
    rest empty: the stream ended early, without error, without the overlay and the root."""
    ids = [f"m{index:02d}" for index in range(20)]
    asyncio.run(_write(tmp_path, ids, ("m02", "m05"), []))

    async def read() -> tuple[list[str], list[str]]:
        service = _service(tmp_path)
        try:
            walk = service.history("k", "", newest_first=True)
            first = [view.info.id for view in await anext(walk)]
            await service.append("k", "", _message("branch"), Parent.of("m03"), from_client=False)
            rest = [view.info.id async for window in walk for view in window]
            return first, rest
        finally:
            await service.registry.close_all()

    first, rest = asyncio.run(read())
    assert "m05" not in first  # the walk had not switched yet when the branch came
    read_ids = first + rest
    assert read_ids[:14] == ids[:5:-1]
    assert read_ids[14].startswith("compaction_") and read_ids[15:] == ["m01", "m00"]


def test_a_walk_from_a_leaf_whose_id_is_empty_switches_at_a_compaction_as_upstream_does(tmp_path: Path) -> None:
    """Upstream's newest-first read from a message whose id is "" walks to the first row that
    ends a compaction, then finds no path for its prefix (an empty leaf id is no leaf to it):
    ["", "c"] (asked of the oracle). The walk here streamed every raw row (b and a, which the
    overlay covers), as the overlays were not noted for a leaf that reads as false."""
    asyncio.run(_write(tmp_path, ["a", "b", "c"], ("a", "b"), [""]))

    async def read() -> list[str]:
        service = _service(tmp_path)
        try:
            return [view.info.id async for window in service.history("k", "", newest_first=True) for view in window]
        finally:
            await service.registry.close_all()

    assert asyncio.run(read()) == ["", "c"]
