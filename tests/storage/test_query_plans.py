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
    assert [m.info.id for m in found] == ["m021", "m022"]
    (statement,) = [s for s in statements if "parent_id" in s]
    plan = " ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}"))
    # Walking the seq index looks every row of the session up again from it: twice the cost.
    assert "_sessions_messages_by_seq" not in plan, plan
    assert "PRIMARY KEY (session_id=?)" in plan, plan
