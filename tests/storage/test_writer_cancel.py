"""The object's writer task cancelled while a commit runs on its thread (the event loop closing
under it): the commit's own outcome answers its writes. The task rolled the writer connection
back from the event loop's thread while the commit thread still used it, and answered "nothing
was written" for writes that then committed."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.storage.store import ObjectStore, WriteContext


def test_a_commit_under_way_answers_its_writes_when_the_writer_task_is_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "object.sqlite"
    entered, release = threading.Event(), threading.Event()

    def held(ctx: WriteContext) -> str:
        ctx.conn.execute("INSERT INTO scratch VALUES ('held')")
        entered.set()
        release.wait(timeout=30)
        return "stored"

    async def scenario() -> str:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=2)
        store = await loop.run_in_executor(executor, ObjectStore.open, "key", path, executor)
        try:
            await store.write(lambda ctx: ctx.conn.execute("CREATE TABLE scratch (name TEXT)"))
            write = asyncio.ensure_future(store.write(held))
            await loop.run_in_executor(None, entered.wait, 30)  # the commit holds its thread
            assert store._writer_task is not None
            store._writer_task.cancel()
            await asyncio.sleep(0)  # the cancellation reaches the task; the commit is still held
            release.set()
            return await write
        finally:
            await store.close()
            executor.shutdown(wait=True)

    assert asyncio.run(scenario()) == "stored"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM scratch").fetchall() == [("held",)]
