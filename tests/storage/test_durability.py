"""Acknowledged = durable (DESIGN.md §1, §5): a write is committed (WAL, synchronous=FULL) before
its response, so a separate connection sees it at once; objects survive closing (hibernation),
restarts, and a clean stop leaves a self-contained file."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sessions_client import SessionsClient
from sessions_server.storage.store import ObjectStore
from tests.conftest import start_server
from tests.service.support import ids, js_json, message_rows, open_readonly, stored_json, text_message
from tests.storage.upstream_schema import object_file

FULL = 2  # PRAGMA synchronous value of FULL


def test_each_acknowledged_write_is_visible_to_another_connection(
    client: Any, live_server: Any, object_key: str
) -> None:
    data_dir = Path(live_server.data_dir)
    session = client.object(object_key).session()
    session.append_message(text_message("m0"))
    with open_readonly(object_file(data_dir, object_key)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

        def contents() -> dict[str, str]:
            return dict(conn.execute("SELECT id, content FROM cf_agents_session_messages").fetchall())

        for i in range(1, 20):
            session.append_message(text_message(f"m{i}", f"text {i}"))
            assert contents()[f"m{i}"] == js_json(text_message(f"m{i}", f"text {i}"))
        session.update_message(text_message("m3", "updated"))
        assert contents()["m3"] == js_json(text_message("m3", "updated"))
        session.delete_messages(["m4"])
        assert "m4" not in contents()
        session.import_message(text_message("imp"), parent_id=None, created_at=1)
        assert "imp" in contents()
        session.clear_messages()
        assert contents() == {}


def test_connections_use_wal_and_synchronous_full(tmp_path: Path) -> None:
    path = tmp_path / "objects" / "ab" / "cd" / "x.sqlite"

    async def scenario() -> tuple[Any, Any, Any, Any]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=2)
        store = await loop.run_in_executor(executor, ObjectStore.open, "key", path, executor)
        try:
            writer_sync = await store.write(lambda ctx: ctx.conn.execute("PRAGMA synchronous").fetchone()[0])
            writer_mode = await store.write(lambda ctx: ctx.conn.execute("PRAGMA journal_mode").fetchone()[0])
            reader_sync = await store.read(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
            reader_mode = await store.read(lambda conn: conn.execute("PRAGMA journal_mode").fetchone()[0])
            return writer_sync, writer_mode, reader_sync, reader_mode
        finally:
            await store.close()
            executor.shutdown(wait=True)

    writer_sync, writer_mode, reader_sync, reader_mode = asyncio.run(scenario())
    assert (writer_sync, writer_mode) == (FULL, "wal")
    assert (reader_sync, reader_mode) == (FULL, "wal")


def test_restart_keeps_everything_and_continues(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    big = text_message("big", "😀中" * 1_000_000)
    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client:
            session = client.object("restart").session("s")
            session.append_messages([text_message("a"), text_message("b"), big])
            session.append_message(text_message("x"), parent_id="a")  # the active leaf is on a branch
    finally:
        server.stop()

    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client:
            session = client.object("restart").session("s")
            assert session.get_latest_leaf() == text_message("x")
            assert ids(session.get_history()) == ["a", "x"]
            assert session.get_history(leaf_id="big") == [text_message("a"), text_message("b"), big]
            result = session.append_message(text_message("y"))
            assert result.parent_id == "x"
            assert message_rows(data_dir, "restart", "s")[-1]["seq"] == 5
            assert session.append_message(text_message("a", "dup")).inserted is False
    finally:
        server.stop()


def test_clean_stop_leaves_a_self_contained_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client:
            client.object("k").session().append_messages([text_message("a"), text_message("b", "x" * 2_000_000)])
    finally:
        server.stop()

    path = object_file(data_dir, "k")
    wal = Path(str(path) + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed on close
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(path, copy)  # the main file alone, as a migration would copy it
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [r[0] for r in conn.execute("SELECT id FROM cf_agents_session_messages ORDER BY seq")] == ["a", "b"]
        assert conn.execute("SELECT count(*) FROM cf_agents_session_message_chunks").fetchone()[0] == 1
    finally:
        conn.close()
    assert stored_json(data_dir, "k", "b") == js_json(text_message("b", "x" * 2_000_000))


def test_objects_closed_when_idle_reopen_with_their_state(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir, max_open_objects=1)
    try:
        with SessionsClient(server.address) as client:
            keys = [f"obj-{i}" for i in range(4)]
            for round_ in range(3):
                for key in keys:  # each request opens an object and pushes another out
                    client.object(key).session().append_message(text_message(f"{key}-{round_}"))
            for key in keys:
                session = client.object(key).session()
                assert ids(session.get_history()) == [f"{key}-{r}" for r in range(3)]
                assert [r["seq"] for r in message_rows(data_dir, key)] == [1, 2, 3]
    finally:
        server.stop()


def test_concurrent_appends_to_one_session_form_one_chain(client: Any, live_server: Any, object_key: str) -> None:
    """One writer per object: concurrent AUTO appends serialize into a single chain with
    distinct, gapless seq values."""
    data_dir = Path(live_server.data_dir)
    session = client.object(object_key).session()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(25):
                session.append_message(text_message(f"w{n}-{i}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    rows = message_rows(data_dir, object_key)
    assert [r["seq"] for r in rows] == list(range(1, 201))
    assert [r["parent_id"] for r in rows] == [None] + [r["id"] for r in rows[:-1]]
    assert len(session.get_history()) == 200
