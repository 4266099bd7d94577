"""A search's texts are read after its ranking, by index rowid, a window at a time; a row whose
rowid another row took since (the last row deleted, a new one indexed: SQLite gives the next row
the freed rowid) must not lend its text to the old hit, also when the new row is the same
message's, written anew with a text that no longer matches."""

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
    hits = [(rowid, message_id, session_id, version) for rowid, message_id, _, session_id, version in ranked]

    (last_rowid,) = [rowid for rowid, message_id, _, _ in hits if message_id == "last"]
    conn.execute("DELETE FROM cf_agents_session_fts WHERE rowid = ?", (last_rowid,))
    queries.insert_search_row(conn, "", "newcomer", "user", "words of another message")
    assert conn.execute("SELECT id FROM cf_agents_session_fts WHERE rowid = ?", (last_rowid,)).fetchone() == (
        "newcomer",
    )

    taken, texts = queries.search_texts(conn, hits, 1 << 20, '"common"')
    assert taken == 2
    assert sorted(texts.values()) == ["common first"]


def test_a_rowid_taken_by_the_same_message_written_anew_gives_its_text_only_if_it_still_matches(
    tmp_path: Path,
) -> None:
    conn = sqlite3.connect(tmp_path / "object.sqlite", isolation_level=None, factory=queries.ObjectConnection)
    schema.initialize(conn, "texts")
    queries.create_fts(conn)
    for seq, message_id in enumerate(("first", "last"), 1):
        conn.execute(
            """INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at, content_hash)
               VALUES ('', ?, ?, 'user', '{}', 0, 'v1')""",
            (message_id, seq),
        )
        queries.insert_search_row(conn, "", message_id, "user", f"common {message_id}")
    ranked = queries.search(conn, "", '"common"', 10)
    hits = [(rowid, message_id, session_id, version) for rowid, message_id, _, session_id, version in ranked]
    (last_rowid,) = [rowid for rowid, message_id, _, _ in hits if message_id == "last"]

    for text, digest, expected in (("rare words", "v2", ["common first"]), ("common again", "v3", None)):
        # The message updated (as `update_in` does): its index row deleted and written anew.
        conn.execute("UPDATE cf_agents_session_messages SET content_hash = ? WHERE id = 'last'", (digest,))
        conn.execute("DELETE FROM cf_agents_session_fts WHERE id = 'last'")
        queries.insert_search_row(conn, "", "last", "user", text)
        assert conn.execute("SELECT id FROM cf_agents_session_fts WHERE rowid = ?", (last_rowid,)).fetchone() == (
            "last",
        )
        taken, texts = queries.search_texts(conn, hits, 1 << 20, '"common"')
        assert taken == 2
        assert sorted(texts.values()) == (expected or ["common again", "common first"])
