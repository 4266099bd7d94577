"""Query plans that matter for cost: SQLite picks them, and a small change in a query can make it
pick a slower one (the results stay the same, so only the plan shows it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sessions_server.storage import queries, schema
from tests.service.support import js_json, text_message


def test_children_read_the_session_in_key_order_not_through_the_seq_index(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "object.sqlite", isolation_level=None, factory=queries.ObjectConnection)
    schema.initialize(conn, "plans")
    rows = [
        ("", f"m{i:03d}", i + 1, f"m{(i - 1) // 2:03d}" if i else None, "user", js_json(text_message(f"m{i:03d}")), i)
        for i in range(200)
    ]
    conn.executemany(
        """INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )
    statements: list[str] = []
    conn.set_trace_callback(statements.append)

    found = queries.children(conn, "", "m010")

    conn.set_trace_callback(None)
    assert [message_id for message_id, _ in found] == ["m021", "m022"]
    (statement,) = [s for s in statements if "parent_id" in s]
    plan = " ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}"))
    # Walking the seq index looks every row of the session up again from it: twice the cost.
    assert "_sessions_messages_by_seq" not in plan, plan
    assert "PRIMARY KEY (session_id=?)" in plan, plan


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
    assert queries.delete_messages(conn, "", ["m020"]) == 1
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
