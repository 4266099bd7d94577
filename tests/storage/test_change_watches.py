"""A watch over a session's changes (storage/watches.py) learns what committed after it began:
the ids a job named, or everything. A job refused in a group and another session's change teach
it nothing; a job sees what its own transaction changed before the commit; past
MAX_WATCHED_IDS it keeps "everything"."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sessions_server.storage import watches as watches_module
from sessions_server.storage.store import ObjectStore, WriteContext
from sessions_server.storage.watches import Changed


def _noting(session_id: str, changed: Changed, *, fail: bool = False) -> Callable[[WriteContext], None]:
    def run(ctx: WriteContext) -> None:
        ctx.note_changed(session_id, changed)
        if fail:
            raise ValueError("refused")

    return run


def _with_store(tmp_path: Path, body: Callable[[ObjectStore], Awaitable[Any]]) -> Any:
    async def scenario() -> Any:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=2)
        store = await loop.run_in_executor(executor, ObjectStore.open, "key", tmp_path / "x.sqlite", executor)
        try:
            return await body(store)
        finally:
            await store.close()
            executor.shutdown(wait=True)

    return asyncio.run(scenario())


def test_a_watch_learns_the_ids_committed_after_it_began_and_nothing_refused(tmp_path: Path) -> None:
    async def body(store: ObjectStore) -> None:
        await store.write(_noting("s", frozenset({"before"})))
        watch = store.feed.watches.start("s")
        assert not watch.touches({"before"})  # committed before the watch began
        await store.write(_noting("other", frozenset({"a"})))
        assert not watch.touches({"a"})
        outcomes = await asyncio.gather(
            store.write(_noting("s", frozenset({"kept"}))),
            store.write(_noting("s", frozenset({"refused"}), fail=True)),
            return_exceptions=True,
        )
        assert outcomes[0] is None and isinstance(outcomes[1], ValueError)
        assert watch.touches({"kept", "x"})
        assert not watch.touches({"refused"})  # its savepoint was rolled back: no change
        watch.restart()
        assert not watch.touches({"kept"})
        await store.write(_noting("s", None))  # a clear, say
        assert watch.touches({"anything"})
        watch.stop()
        assert not store.feed.watches

    _with_store(tmp_path, body)


def test_a_job_sees_what_its_own_transaction_changed_before_the_commit(tmp_path: Path) -> None:
    async def body(store: ObjectStore) -> list[bool]:
        watch = store.feed.watches.start("s")
        seen: list[bool] = []

        def change_then_check(ctx: WriteContext) -> None:
            ctx.note_changed("s", frozenset({"m1"}))
            seen.append(watch.touches({"m1"}))  # not committed: the watch has not learnt it
            seen.append(ctx.touched(watch, {"m1"}))
            seen.append(ctx.touched(watch, {"m2"}))

        await store.write(change_then_check)
        seen.append(watch.touches({"m1"}))
        return seen

    assert _with_store(tmp_path, body) == [False, True, False, True]


def test_a_watch_past_its_bound_keeps_everything(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(watches_module, "MAX_WATCHED_IDS", 3)

    async def body(store: ObjectStore) -> tuple[bool, bool]:
        watch = store.feed.watches.start("s")
        await store.write(_noting("s", frozenset({"a", "b"})))
        within = watch.touches({"c"})
        await store.write(_noting("s", frozenset({"c", "d"})))
        return within, watch.touches({"z"})

    assert _with_store(tmp_path, body) == (False, True)
