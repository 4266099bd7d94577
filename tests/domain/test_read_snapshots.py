"""A read is one state of the session even while commits wait for their bookkeeping.

A commit is visible to readers (on reader threads) as soon as SQLite has it, but what the server
remembers of the session (`paths`: the path, the messages read along it) is brought up to date
afterwards, on the event loop. Reads that took a remembered message beside a path walked in
storage made states that never existed: after a clear and a new message under a reused id, the
new path came back with the old message's text (a concurrency audit's finding). Here the
bookkeeping of the commits is held back (`ObjectStore._settle` waits for the test) while reads
run, so the gap is as wide as the test needs; no timing decides the outcome.

Runs the domain over real object files (no gRPC), with reads on reader threads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.domain.views import MessageView
from sessions_server.storage import store as store_module
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent

GUARD_SECONDS = 30.0  # a failure guard, never a synchronisation device


def _message(message_id: str, text: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})


def _read(views: list[MessageView]) -> list[tuple[str, str, str | None]]:
    """(id, text, parent id as the row says) of each message."""
    out = []
    for view in views:
        assert view.info is not None
        out.append((view.info.id, json.loads(view.json)["parts"][0]["text"], view.info.parent_id))
    return out


class HeldBookkeeping:
    """Holds back each commit's bookkeeping (`_settle`) until `release`; counts those held."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held: list[tuple[Any, tuple[Any, ...]]] = []
        self.arrived = asyncio.Event()
        self.wanted = 0
        original = store_module.ObjectStore._settle
        self._original: Callable[..., None] = original

        def settle(store: Any, *args: Any) -> None:
            self.held.append((store, args))
            if len(self.held) >= self.wanted:
                self.arrived.set()

        monkeypatch.setattr(store_module.ObjectStore, "_settle", settle)
        self._monkeypatch = monkeypatch

    async def wait_for(self, commits: int) -> None:
        self.wanted = commits
        self.arrived.clear()
        if len(self.held) < commits:
            await asyncio.wait_for(self.arrived.wait(), GUARD_SECONDS)

    def release(self) -> None:
        self._monkeypatch.setattr(store_module.ObjectStore, "_settle", self._original)
        for store, args in self.held:
            self._original(store, *args)
        self.held.clear()


@asynccontextmanager
async def _service(data_dir: Path) -> AsyncIterator[SessionsService]:
    executor = ThreadPoolExecutor(max_workers=4)
    registry = ObjectRegistry(data_dir, executor, calls_in_flight=lambda: 5)  # every read on a thread
    try:
        yield SessionsService(registry)
    finally:
        await registry.close_all()
        executor.shutdown()


async def _history(service: SessionsService, **options: Any) -> list[MessageView]:
    return [view async for window in service.history("k", "", **options) for view in window]


async def _recent(service: SessionsService) -> list[MessageView]:
    items = service.recent_history("k", "", 1 << 20)
    return [item for window in [x async for x in items][1:] for item in window]  # after the summary


async def _appended(service: SessionsService, *messages: tuple[str, str]) -> None:
    batch = [AppendInput(_message(message_id, text), Parent.auto(), True) for message_id, text in messages]
    await service.append_many("k", "", batch)


READS = {
    "root first": lambda service: _history(service),
    "newest first": lambda service: _history(service, newest_first=True),
    "recent": _recent,
}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_clear_and_a_reused_id_never_bring_the_old_message_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    """Finding 1 of the audit, held still: the session held a, b (remembered by a read); a clear
    and a new `a` commit, their bookkeeping waits. A read then sees the new path (a alone) and
    must show the new a, not the old one the memo still held."""

    async def scenario() -> tuple[list[tuple[str, str, str | None]], list[tuple[str, str, str | None]]]:
        async with _service(tmp_path) as service:
            await _appended(service, ("a", "old a"), ("b", "old b"))
            for _ in range(2):  # the path and its messages remembered, as after an agent's turn
                assert [view.info.id for view in await READS[read](service) if view.info] in (["a", "b"], ["b", "a"])
            held = HeldBookkeeping(monkeypatch)
            cleared = asyncio.ensure_future(service.clear("k", ""))
            await held.wait_for(1)
            appended = asyncio.ensure_future(_appended(service, ("a", "new a")))
            await held.wait_for(2)
            during = _read(await READS[read](service))
            held.release()
            assert await cleared == 2
            await appended
            return during, _read(await READS[read](service))

    during, after = asyncio.run(scenario())
    assert after == [("a", "new a", None)]
    assert during == [("a", "new a", None)]  # the old code: [("a", "old a", None)] beside the new path


def test_an_update_after_an_append_is_not_read_on_the_older_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 3 of the audit, held still: c appended under b, then b updated; a read that took
    the remembered path (a, b: the append not yet noted) with b's new text from storage showed a
    state that never existed (b updated while still the leaf)."""

    async def scenario() -> list[tuple[str, str, str | None]]:
        async with _service(tmp_path) as service:
            await _appended(service, ("a", "a"), ("b", "old b"))
            for _ in range(2):
                await _history(service)
            held = HeldBookkeeping(monkeypatch)
            appended = asyncio.ensure_future(_appended(service, ("c", "c")))
            await held.wait_for(1)
            updated = asyncio.ensure_future(service.update("k", "", _message("b", "new b"), from_client=True))
            await held.wait_for(2)
            during = _read(await _history(service))
            held.release()
            await appended
            assert (await updated).changed
            return during

    assert asyncio.run(scenario()) == [("a", "a", None), ("b", "new b", "a"), ("c", "c", "b")]
