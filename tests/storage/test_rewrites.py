"""Rewrites of an object's file (storage/store.py `ObjectStore.rewrite_compactly`, VacuumObject):
each takes its turn (the caller's: a slot, room on the disk), then runs on the object's writer
between two commits, so writes wait for it. Callers asking while one waits share it, a caller
gone before it began withdraws it, one gone after waits for its end with its turn held, and
rewrites asked for back to back let the writes queued meanwhile go between them: without that, two clients
vacuuming in a loop shut an object's writes out (no append in 70 s), and 20 vacuum calls that
gave up at once left 84 s of rewrites in front of the next append."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sessions_server.storage import store as store_module
from sessions_server.storage.store import ObjectStore, WriteContext
from tests.storage.test_damaged_objects import KEY, _note, registry

GATE_SECONDS = 30.0  # a bound on every wait below, should the code under test never get there


def _gated(started: threading.Event, release: threading.Event, order: list[str]) -> Callable[[WriteContext], None]:
    """A write job that holds the writer until `release`."""

    def run(ctx: WriteContext) -> None:
        started.set()
        release.wait(GATE_SECONDS)
        order.append("write")

    return run


def _written_note(order: list[str], name: str) -> Callable[[WriteContext], None]:
    store_note = _note(name)

    def run(ctx: WriteContext) -> None:
        store_note(ctx)
        order.append("write")

    return run


async def _writer_held(store: ObjectStore, order: list[str]) -> tuple[asyncio.Future[Any], threading.Event]:
    started, release = threading.Event(), threading.Event()
    held = asyncio.ensure_future(store.write(_gated(started, release, order)))
    assert await asyncio.to_thread(started.wait, GATE_SECONDS)
    return held, release


def test_callers_asking_while_a_rewrite_waits_share_it(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"

    async def scenario() -> int:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(_note("first"))
            held, release = await _writer_held(store, [])
            asked = [asyncio.ensure_future(store.rewrite_compactly(scratch, contextlib.nullcontext)) for _ in range(3)]
            await asyncio.sleep(0)  # each task runs to its wait (tasks start in the order made)
            release.set()
            await held
            await asyncio.gather(*asked)
            return store.rewrites

    assert asyncio.run(scenario()) == 1


def test_a_caller_gone_before_its_rewrite_began_withdraws_it(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"

    async def scenario() -> tuple[int, bool]:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(_note("first"))
            held, release = await _writer_held(store, [])
            alone = asyncio.ensure_future(store.rewrite_compactly(scratch, contextlib.nullcontext))
            shared = [asyncio.ensure_future(store.rewrite_compactly(scratch, contextlib.nullcontext)) for _ in range(2)]
            await asyncio.sleep(0)
            shared[0].cancel()  # another still waits for it: it stays
            await asyncio.gather(shared[0], return_exceptions=True)
            release.set()
            await held
            await asyncio.gather(alone, shared[1])
            first = store.rewrites

            held, release = await _writer_held(store, [])
            gone = asyncio.ensure_future(store.rewrite_compactly(scratch, contextlib.nullcontext))
            await asyncio.sleep(0)
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            release.set()
            await held
            await store.write(_note("after"))
            await store.settled()
            return first, store.rewrites == first

    first, none_since = asyncio.run(scenario())
    assert first == 1
    assert none_since


def test_writes_queued_during_a_rewrite_go_before_the_next_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    order: list[str] = []
    begun, release = threading.Event(), threading.Event()
    snapshot = store_module.files.snapshot_object

    def gated_snapshot(path: Path, directory: Path, row_writes: int) -> Path:
        order.append("rewrite")
        begun.set()
        release.wait(GATE_SECONDS)
        return snapshot(path, directory, row_writes)

    monkeypatch.setattr(store_module.files, "snapshot_object", gated_snapshot)

    async def scenario() -> None:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(_note("first"))
            first = asyncio.ensure_future(store.rewrite_compactly(scratch, contextlib.nullcontext))
            assert await asyncio.to_thread(begun.wait, GATE_SECONDS)
            write = asyncio.ensure_future(store.write(_written_note(order, "queued during the rewrite")))
            second = asyncio.ensure_future(store.rewrite_compactly(scratch, contextlib.nullcontext))
            await asyncio.sleep(0)
            release.set()
            await asyncio.gather(first, write, second)

    asyncio.run(scenario())
    assert order == ["rewrite", "write", "rewrite"]


def test_a_caller_cancelled_once_its_rewrite_began_holds_its_turn_until_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn (a slot, room on the disk for the copy) covers the whole rewrite: released when
    the caller went, another rewrite would find the slot free and the room not reserved."""
    scratch = tmp_path / "scratch"
    order: list[str] = []
    begun, release = threading.Event(), threading.Event()
    snapshot = store_module.files.snapshot_object

    def gated_snapshot(path: Path, directory: Path, row_writes: int) -> Path:
        begun.set()
        release.wait(GATE_SECONDS)
        order.append("copied")
        return snapshot(path, directory, row_writes)

    @contextlib.asynccontextmanager
    async def turn() -> AsyncIterator[None]:
        order.append("turn taken")
        try:
            yield
        finally:
            order.append("turn given back")

    monkeypatch.setattr(store_module.files, "snapshot_object", gated_snapshot)

    async def scenario() -> None:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(_note("first"))
            caller = asyncio.ensure_future(store.rewrite_compactly(scratch, turn))
            assert await asyncio.to_thread(begun.wait, GATE_SECONDS)
            caller.cancel()
            await asyncio.sleep(0)  # the cancellation reaches the caller, which waits on
            assert not caller.done()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await caller
            order.append("caller ended")
            assert store.rewrites == 1

    asyncio.run(scenario())
    assert order == ["turn taken", "copied", "turn given back", "caller ended"]


def test_a_rewrite_waiting_for_its_turn_is_shared_and_dropped_with_its_turn_when_no_one_waits(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    turns: list[str] = []
    slot = asyncio.Semaphore(0)  # no turn until released

    @contextlib.asynccontextmanager
    async def turn() -> AsyncIterator[None]:
        turns.append("waiting")
        async with slot:
            turns.append("taken")
            yield

    async def scenario() -> tuple[int, int]:
        async with registry(tmp_path) as objects, objects.use(KEY) as store:
            await store.write(_note("first"))
            asked = [asyncio.ensure_future(store.rewrite_compactly(scratch, turn)) for _ in range(3)]
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # the turn's task waits for the slot
            for caller in asked:
                caller.cancel()
            await asyncio.gather(*asked, return_exceptions=True)
            slot.release()
            await store.write(_note("after"))
            await store.settled()
            withdrawn = store.rewrites
            shared = [asyncio.ensure_future(store.rewrite_compactly(scratch, turn)) for _ in range(3)]
            await asyncio.sleep(0)
            await asyncio.gather(*shared)
            return withdrawn, store.rewrites

    withdrawn, after = asyncio.run(scenario())
    assert withdrawn == 0
    assert after == 1
    assert turns == ["waiting", "waiting", "taken"]
