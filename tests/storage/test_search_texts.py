"""A search's texts are read after its ranking, by index rowid, a window at a time; a row whose
rowid another message's row took since (the last row deleted, a new one indexed: SQLite gives
the next row the freed rowid) must not lend its text to the old hit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sessions_server.storage import queries, schema


def test_a_rowid_taken_by_another_message_since_the_ranking_gives_no_text(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "object.sqlite", isolation_level=None, factory=queries.ObjectConnection)
    schema.initialize(conn, "texts")
    queries.create_fts(conn)
    for seq, (message_id, text) in enumerate((("first", "common first"), ("last", "common last"), ("newcomer", "")), 1):
        conn.execute(
            """INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at)
               VALUES ('', ?, ?, 'user', '{}', 0)""",
            (message_id, seq),
        )
        if text:
            queries.insert_search_row(conn, "", message_id, "user", text)
    ranked = queries.search(conn, "", '"common"', 10)
    hits = [(rowid, message_id, session_id) for rowid, message_id, _, session_id in ranked]

    (last_rowid,) = [rowid for rowid, message_id, _ in hits if message_id == "last"]
    conn.execute("DELETE FROM cf_agents_session_fts WHERE rowid = ?", (last_rowid,))
    queries.insert_search_row(conn, "", "newcomer", "user", "words of another message")
    assert conn.execute("SELECT id FROM cf_agents_session_fts WHERE rowid = ?", (last_rowid,)).fetchone() == (
        "newcomer",
    )

    taken, texts = queries.search_texts(conn, hits, 1 << 20, '"common"')
    assert taken == 2
    assert sorted(texts.values()) == ["common first"]
