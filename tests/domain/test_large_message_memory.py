"""What a large message's write holds, over real object files, no gRPC.

A message of hundreds of megabytes was held in four forms while its rows went in (the writer's
text, the parsed value, the canonical JSON and the row slices: a 100 MB upload took the server's
RSS up by 600 MB). The canonical JSON is now the writer's own text when it is that character for
character, as the clients send it, and the slices are cut from it one at a time as they are
written. What the write holds is measured (tracemalloc, Python's allocations only, SQLite's page
cache aside) as its continuation rows go in, and after it; the writer's text was made before
tracing started, so it is not counted. Sizes are the JSON's UTF-8 bytes. A string of other
characters than ASCII keeps its UTF-8 form once orjson has read it (CPython caches it in the
string): the writer's text is given to orjson as bytes, so it keeps none; the parsed value's
(made by the canonical JSON's encoding) stays for as long as the value."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.service import SessionsService
from sessions_server.storage import queries
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent

MIB = 1024 * 1024
TEXT_CHARS = 24 * MIB


def _compact(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


@pytest.fixture
def held_while_writing(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Bytes traced as each message's continuation rows are written."""
    seen: list[int] = []
    original: Callable[..., None] = queries.write_continuations

    def measured(*args: Any) -> None:
        seen.append(tracemalloc.get_traced_memory()[0])
        original(*args)

    monkeypatch.setattr(queries, "write_continuations", measured)
    yield seen


@pytest.mark.parametrize(
    ("character", "bound"),
    # ASCII: the parsed value's text part. CJK (2 bytes a character in memory, 3 in UTF-8): the
    # parsed value's text and its UTF-8 form, 5/3 of the size (the writer's text kept its UTF-8
    # form too: 8/3).
    [("x", 1.3), ("中", 2.0)],
    ids=["ascii", "cjk"],
)
def test_a_large_append_holds_the_message_about_once_beside_the_writers_text(
    tmp_path: Path, held_while_writing: list[int], character: str, bound: float
) -> None:
    text = _compact({"id": "big", "role": "user", "parts": [{"type": "text", "text": character * TEXT_CHARS}]})
    size = len(text.encode("utf-8"))

    async def run() -> tuple[int, int]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append(
                "o", "", _compact({"id": "m0", "role": "user", "parts": []}), Parent.auto(), from_client=False
            )
            gc.collect()
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                result = await service.append("o", "", text, Parent.auto(), from_client=False)
                assert result.inserted and result.message.json is text
                del result
                gc.collect()
                after = tracemalloc.get_traced_memory()[0] - base
            finally:
                tracemalloc.stop()
            stored = await service.get_message("o", "", "big")
            assert stored is not None and stored.json == text
            return base, after
        finally:
            await service.registry.close_all()

    base, after = asyncio.run(run())
    assert len(held_while_writing) == 1
    during = held_while_writing[0] - base
    # The parsed value and small things: no second copy of the JSON, no slices.
    assert during < bound * size, f"held {during / size:.2f}x the message while writing its rows"
    assert after < 0.3 * size, f"held {after / size:.2f}x the message after its write"
