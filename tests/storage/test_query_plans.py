"""Query plans that matter for cost: SQLite picks them, and a small change in a query can make it
pick a slower one (the results stay the same, so only the plan shows it)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

from sessions_server.storage import queries, schema
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.store import WriteContext
from tests.service.support import js_json, text_message
from tests.storage.upstream_schema import write_upstream_store

KEY = "plans"


TREE_ROWS = [
    ("", f"m{i:03d}", i + 1, f"m{(i - 1) // 2:03d}" if i else None, "user", js_json(text_message(f"m{i:03d}")), i)
    for i in range(200)
]  # a binary tree: m010's children are m021 and m022, and m004 is m010's parent


def _insert_tree(conn: sqlite3.Connection) -> None:
    conn.executemany(
        """INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?)""",
        TREE_ROWS,
    )


def _upstream_file(path: Path) -> None:
    write_upstream_store(path, TREE_ROWS)


def _older_servers_file(path: Path) -> None:
    """A file this service created before `_sessions_messages_by_parent` existed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        schema.initialize(conn, KEY)
        conn.execute("DROP INDEX _sessions_messages_by_parent")
        _insert_tree(conn)


def _children_and_reattach_plans(ctx: WriteContext) -> dict[str, object]:
    """Runs the children lookup and a delete that re-attaches children, on the store's own
    connection, and returns their results and the plans of the statements that find children."""
    conn = ctx.conn
    if conn.execute("SELECT 1 FROM cf_agents_session_messages LIMIT 1").fetchone() is None:
        _insert_tree(conn)  # a fresh object: its first write made the file
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    children = queries.children(conn, "", "m010")
    deleted, _ = queries.delete_messages(conn, "", ["m010"])
    conn.set_trace_callback(None)
    reattached = conn.execute(
        "SELECT id, parent_id FROM cf_agents_session_messages WHERE id IN ('m021', 'm022') ORDER BY id"
    ).fetchall()
    (children_sql,) = [s for s in statements if "parent_id = " in s and s.lstrip().startswith("SELECT")]
    (reattach_sql,) = [s for s in statements if "child.parent_id IN" in s]
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (id TEXT PRIMARY KEY) WITHOUT ROWID")

    def plan(sql: str) -> list[str]:
        return [str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]

    return {
        "children": children,
        "deleted": deleted,
        "reattached": reattached,
        "children_plan": plan(children_sql),
        "reattach_plan": plan(reattach_sql),
    }


async def _through_the_registry(data_dir: Path) -> dict[str, object]:
    """The object opened as the server opens it (storage/registry.py: in place when ready,
    otherwise created or upgraded on the executor)."""
    executor = ThreadPoolExecutor(max_workers=2)
    objects = ObjectRegistry(data_dir, executor)
    try:
        async with objects.use(KEY) as store:
            return await store.write(_children_and_reattach_plans)
    finally:
        await objects.close_all()
        executor.shutdown()


@pytest.mark.parametrize("made_by", [None, _upstream_file, _older_servers_file], ids=["new", "upstream", "older"])
def test_children_and_the_deletes_reattach_seek_the_parent_index(
    tmp_path: Path, made_by: Callable[[Path], None] | None
) -> None:
    """GetBranches and DeleteMessages find a row's children with one seek of
    `_sessions_messages_by_parent` (they read the whole session: ~37 ms at 100,000 messages),
    on a new object and on files made without the index (upstream's, an older server's),
    which gain it when opened."""
    if made_by is not None:
        made_by(object_path(tmp_path, KEY))

    found = asyncio.run(_through_the_registry(tmp_path))

    assert found["children"] == [("m021", 22), ("m022", 23)]
    assert found["deleted"] == 1
    assert found["reattached"] == [("m021", "m004"), ("m022", "m004")]
    children_plan = found["children_plan"]
    reattach_plan = found["reattach_plan"]
    assert isinstance(children_plan, list) and isinstance(reattach_plan, list)
    # the index covers the lookup (`id` is in every index of a WITHOUT ROWID table) and orders it
    assert children_plan == [
        "SEARCH cf_agents_session_messages USING COVERING INDEX _sessions_messages_by_parent "
        "(session_id=? AND parent_id=?)"
    ], children_plan
    assert (
        "SEARCH child USING COVERING INDEX _sessions_messages_by_parent (session_id=? AND parent_id=?)" in reattach_plan
    ), reattach_plan
    assert not any(step.startswith(("SCAN cf_agents_session_messages", "SCAN child")) for step in reattach_plan)


def test_children_come_in_seq_order_with_ties_in_id_order(tmp_path: Path) -> None:
    """The index gives the order the sort gave (imported rows may share a seq)."""
    conn = sqlite3.connect(tmp_path / "object.sqlite", isolation_level=None, factory=queries.ObjectConnection)
    schema.initialize(conn, "plans")
    conn.executemany(
        """INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at)
           VALUES (?, ?, ?, ?, ?, '{}', 0)""",
        [
            ("", "root", 1, None, "user"),
            ("", "z", 2, "root", "user"),
            ("", "b", 5, "root", "user"),
            ("", "a", 5, "root", "user"),
            ("", "c", 3, "root", "user"),
            ("other", "x", 4, "root", "user"),
        ],
    )
    assert queries.children(conn, "", "root") == [("z", 2), ("c", 3), ("a", 5), ("b", 5)]
    conn.close()


def test_search_index_maintenance_finds_rows_by_key_not_by_reading_the_whole_index(tmp_path: Path) -> None:
    """FTS5 finds rows only by rowid or by a match: upstream's `WHERE id = ? AND session_id = ?`
    read every row of the index for each update or delete (seconds at a million messages). An
    index built before the lookup index existed (by upstream, or an older server) gets it at
    its first maintenance."""
    conn = sqlite3.connect(tmp_path / "object.sqlite", isolation_level=None, factory=queries.ObjectConnection)
    schema.initialize(conn, "plans")
    queries.create_fts(conn)
    for session_id in ("", "other"):
        for i in range(100):
            queries.insert_search_row(conn, session_id, f"m{i:03d}", "user", f"words of {session_id} {i}")
    lookup_sql = "SELECT 1 FROM sqlite_master WHERE name = '_sessions_fts_by_message'"
    assert conn.execute(lookup_sql).fetchone() is None  # as upstream builds it

    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    conn.execute("BEGIN")
    assert queries.index_search_text(conn, "", "m010", "user", "changed words", replace=True) == 2
    assert queries.index_search_text(conn, "", "m011", "user", "words of  11", replace=True) == 0
    conn.execute(
        """INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at)
           VALUES ('', 'm020', 1, 'user', '{}', 0)"""
    )
    assert queries.delete_messages(conn, "", ["m020"])[0] == 1
    queries.clear_session(conn, "other")
    conn.execute("COMMIT")
    conn.set_trace_callback(None)

    assert conn.execute(lookup_sql).fetchone() is not None
    remaining = conn.execute(
        "SELECT session_id, id, content FROM cf_agents_session_fts WHERE id IN ('m010', 'm011', 'm020')"
    ).fetchall()
    assert sorted(remaining) == [("", "m010", "changed words"), ("", "m011", "words of  11")]
    assert conn.execute("SELECT COUNT(*) FROM cf_agents_session_fts WHERE session_id = 'other'").fetchone() == (0,)
    plans = []
    for statement in statements:
        ours = not statement.startswith("--")  # not FTS5's own statements on its tables
        if ours and "cf_agents_session_fts" in statement and not statement.upper().startswith(("INSERT", "CREATE")):
            plans += [str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}")]
    fts_plans = [plan for plan in plans if "cf_agents_session_fts" in plan]
    assert fts_plans, statements
    for plan in fts_plans:
        by_rowid = "VIRTUAL TABLE INDEX 0:=" in plan
        by_key = "cf_agents_session_fts_content USING" in plan and "_sessions_fts_by_message" in plan
        assert by_rowid or by_key, plan
    conn.close()


def test_a_page_of_sessions_costs_its_sessions_not_the_object(tmp_path: Path) -> None:
    """ListSessions pages step from one session id to the next by index seeks and count only the
    page's own rows (it grouped every row of the object for each page). Sessions holding only
    compactions are listed too, with 0 messages."""
    conn = sqlite3.connect(tmp_path / "object.sqlite", isolation_level=None, factory=queries.ObjectConnection)
    schema.initialize(conn, "plans")
    sessions = [f"s{i:03d}" for i in range(60)]
    rows = [
        (session_id, f"m{j}", j + 1, None, "user", js_json(text_message(f"m{j}")), j)
        for index, session_id in enumerate(sessions)
        for j in range(index % 4 + 1)
    ]
    conn.executemany(
        """INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?)""",
        [*rows, ("", "m0", 1, None, "user", js_json(text_message("m0")), 0)],
    )
    conn.executemany(
        """INSERT INTO cf_agents_session_compactions
             (session_id, id, seq, summary, from_message_id, to_message_id, created_at)
           VALUES (?, 'c1', 1, 'summary', 'm0', 'm0', 0)""",
        [("s010",), ("s045a",), ("zz-only-compactions",)],
    )
    expected = sorted(
        [("", 1), *((s, i % 4 + 1) for i, s in enumerate(sessions)), ("s045a", 0), ("zz-only-compactions", 0)]
    )

    listed: list[tuple[str, int]] = []
    after: str | None = None
    while page := queries.sessions_page(conn, after, 7):
        assert len(page) <= 7
        listed += page
        after = page[-1][0]
    assert listed == expected
    assert queries.sessions_page(conn, "s058", 100) == [("s059", 4), ("zz-only-compactions", 0)]

    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    queries.sessions_page(conn, "s020", 5)
    conn.set_trace_callback(None)
    (statement,) = statements
    plan = [str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}")]
    assert not any(step.startswith("SCAN cf_agents_session") or step.startswith("SCAN m") for step in plan), plan
    conn.close()
