"""Object files are upstream's format (reference notes §1; DESIGN.md §1, §5): the same tables and
DDL, every table WITHOUT ROWID, the schema version in `_cf_KV` as workerd stores it, WAL, and
16 KiB pages for new files."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.service.support import open_readonly, text_message
from tests.storage.upstream_schema import (
    SCHEMA_VERSION_1,
    SCHEMA_VERSION_KEY,
    UPSTREAM_DDL,
    UPSTREAM_TABLES,
    normalized,
    object_file,
)


@pytest.fixture
def new_file(client: Any, live_server: Any, object_key: str) -> Path:
    client.object(object_key).session().append_message(text_message("a"))
    return object_file(Path(live_server.data_dir), object_key)


def tables(conn: sqlite3.Connection) -> dict[str, str]:
    rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    return {row[0]: row[1] for row in rows}


def test_new_file_uses_16_kib_pages_and_wal(new_file: Path) -> None:
    with open_readonly(new_file) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    header = new_file.read_bytes()[:100]
    assert header[:16] == b"SQLite format 3\x00"
    assert int.from_bytes(header[16:18], "big") == 16384
    assert (header[18], header[19]) == (2, 2)  # WAL read/write versions


def test_schema_version_record_is_upstreams(new_file: Path) -> None:
    with open_readonly(new_file) as conn:
        rows = conn.execute("SELECT key, value, typeof(value) FROM _cf_KV").fetchall()
    assert [tuple(r) for r in rows] == [(SCHEMA_VERSION_KEY, SCHEMA_VERSION_1, "blob")]


def test_tables_and_ddl_are_upstreams(new_file: Path) -> None:
    with open_readonly(new_file) as conn:
        found = tables(conn)
        indexes = conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'").fetchall()
    # every upstream table, with upstream's exact DDL
    for name, ddl in UPSTREAM_DDL.items():
        assert name in found, name
        assert normalized(found[name]) == normalized(ddl), name
    # nothing in upstream's namespaces beyond them: no FTS before a search, no context blocks
    ours = {n for n in found if n.startswith(("cf_", "_cf_", "assistant_"))}
    assert ours == set(UPSTREAM_TABLES)
    assert "cf_agents_session_fts" not in found
    assert "cf_agents_context_blocks" not in found
    # at most one private table (the object-key record), and three private indexes, documented
    # additions: the active leaf lookup by (session_id, seq), a row's children by
    # (session_id, parent_id, seq) and the messages naming an attachment by hash; upstream's
    # tables carry no index of theirs
    assert len(set(found) - UPSTREAM_TABLES) <= 1
    assert sorted(tuple(index) for index in indexes) == [
        ("_sessions_attachment_refs_by_hash",),
        ("_sessions_messages_by_parent",),
        ("_sessions_messages_by_seq",),
    ]


def test_every_table_is_without_rowid(new_file: Path) -> None:
    with open_readonly(new_file) as conn:
        for name, sql in tables(conn).items():
            assert sql.rstrip().upper().endswith("WITHOUT ROWID"), name
            with pytest.raises(sqlite3.OperationalError):
                conn.execute(f'SELECT rowid FROM "{name}"')


def test_message_columns(new_file: Path) -> None:
    with open_readonly(new_file) as conn:
        info = conn.execute("PRAGMA table_info('cf_agents_session_messages')").fetchall()
    columns = [(r[1], r[2], r[3], r[4], r[5]) for r in info]  # name, type, notnull, default, pk
    assert columns == [
        ("session_id", "TEXT", 1, None, 1),
        ("id", "TEXT", 1, None, 2),
        ("seq", "INTEGER", 1, None, 0),
        ("parent_id", "TEXT", 0, None, 0),
        ("type", "TEXT", 1, "'message'", 0),
        ("role", "TEXT", 1, None, 0),
        ("content", "TEXT", 1, None, 0),
        ("content_chunks", "INTEGER", 1, "0", 0),
        ("token_estimate", "INTEGER", 1, "0", 0),
        ("created_at", "INTEGER", 1, None, 0),
        ("content_hash", "TEXT", 0, None, 0),
    ]


def test_values_are_stored_with_upstreams_types(new_file: Path) -> None:
    with open_readonly(new_file) as conn:
        row = conn.execute(
            "SELECT typeof(session_id), typeof(id), typeof(seq), typeof(parent_id), typeof(type), typeof(role),"
            " typeof(content), typeof(content_chunks), typeof(token_estimate), typeof(created_at),"
            " typeof(content_hash) FROM cf_agents_session_messages"
        ).fetchone()
    assert tuple(row) == (
        "text",
        "text",
        "integer",
        "null",
        "text",
        "text",
        "text",
        "integer",
        "integer",
        "integer",
        "text",
    )


def test_the_first_write_creates_the_file_with_the_schema(client: Any, live_server: Any, object_key: str) -> None:
    """An object starts with its first write (a read of one never written creates nothing): the
    schema and version are created on open, whatever the write (here one that stores no message)."""
    session = client.object(object_key).session()
    assert session.get_history() == []
    path = object_file(Path(live_server.data_dir), object_key)
    assert not path.exists()
    session.set_compaction_policy(0)
    with open_readonly(path) as conn:
        assert set(tables(conn)) >= UPSTREAM_TABLES
        assert conn.execute("SELECT value FROM _cf_KV WHERE key = ?", (SCHEMA_VERSION_KEY,)).fetchone()[0] == (
            SCHEMA_VERSION_1
        )
        assert conn.execute("SELECT count(*) FROM cf_agents_session_messages").fetchone()[0] == 0


def test_store_open_creates_16_kib_pages(tmp_path: Path) -> None:
    """The storage layer alone: a new object file gets 16 KiB pages (and keeps WAL)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from sessions_server.storage.store import ObjectStore

    path = object_file(tmp_path, "fresh")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1)
        store = await loop.run_in_executor(executor, ObjectStore.open, "fresh", path, executor)
        await store.close()
        executor.shutdown(wait=True)

    asyncio.run(scenario())
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    finally:
        conn.close()
