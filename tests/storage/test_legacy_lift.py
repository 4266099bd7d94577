"""The legacy lift on open (reference notes §1 startup, §10): `assistant_*` tables from agents
<= 0.22 are copied into upstream's tables, verified, dropped, and the version is stamped only when
the lift is complete."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from sessions_server.storage.queries import FTS_DDL
from tests.service.support import message_rows, open_readonly, text_message
from tests.storage.upstream_schema import SCHEMA_VERSION_1, SCHEMA_VERSION_KEY, UPSTREAM_DDL, object_file

LEGACY_DDL = (
    """CREATE TABLE assistant_messages (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL DEFAULT '',
        parent_id TEXT,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP
    )""",
    "CREATE INDEX idx_assistant_messages_parent ON assistant_messages(parent_id)",
    "CREATE INDEX idx_assistant_messages_session ON assistant_messages(session_id)",
    """CREATE TABLE assistant_compactions (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL DEFAULT '',
        summary TEXT NOT NULL,
        from_message_id TEXT NOT NULL,
        to_message_id TEXT NOT NULL,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP
    )""",
    "CREATE TABLE assistant_sessions (id TEXT PRIMARY KEY, name TEXT)",
    "CREATE TABLE assistant_config (key TEXT PRIMARY KEY, value TEXT)",
)


def content(message_id: str, text: str) -> str:
    return json.dumps(text_message(message_id, text), separators=(",", ":"))


def write_legacy_store(path: Path, *, conflicting_row: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for ddl in LEGACY_DDL:
            conn.execute(ddl)
        conn.executemany(
            "INSERT INTO assistant_messages (id, session_id, parent_id, role, content, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("m1", "", None, "user", content("m1", "first"), "2026-01-02 03:04:00"),
                ("m3", "", "m1", "user", content("m3", "third"), "2026-01-02 03:04:02"),
                ("m2", "", "m1", "assistant", content("m2", "second"), "2026-01-02 03:04:01"),
                ("s1", "side", None, "user", content("s1", "side session"), "2026-01-02 03:04:03"),
            ],
        )
        conn.execute(
            "INSERT INTO assistant_compactions (id, session_id, summary, from_message_id, to_message_id, created_at)"
            " VALUES ('legacy-c1', '', 'summary text', 'm1', 'm2', '2026-01-02 03:05:00')"
        )
        conn.execute("INSERT INTO assistant_sessions VALUES ('', 'default')")
        conn.execute("INSERT INTO assistant_config VALUES ('k', 'v')")
        if conflicting_row:
            conn.execute(UPSTREAM_DDL["cf_agents_session_messages"])
            conn.execute(
                "INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at)"
                " VALUES ('', 'm2', 9, 'assistant', ?, 0)",
                (content("m2", "a different payload"),),
            )
    finally:
        conn.close()


def table_names(path: Path) -> set[str]:
    with open_readonly(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_legacy_tables_are_lifted_and_dropped(client: Any, live_server: Any, object_key: str) -> None:
    data_dir = Path(live_server.data_dir)
    path = object_file(data_dir, object_key)
    write_legacy_store(path)
    session = client.object(object_key).session()

    # seq by created_at; the newest row (m3) is the active leaf
    assert [m["id"] for m in session.get_history()] == ["m1", "m3"]
    assert [m["id"] for m in session.get_branches("m1")] == ["m2", "m3"]
    rows = message_rows(data_dir, object_key)
    assert [(r["id"], r["seq"], r["parent_id"]) for r in rows] == [("m1", 1, None), ("m2", 2, "m1"), ("m3", 3, "m1")]
    m1 = rows[0]
    assert m1["content"] == content("m1", "first")  # verbatim
    assert m1["token_estimate"] == len(m1["content"].encode()) // 4  # not the heuristic
    assert m1["created_at"] == 1_767_323_040_000  # 2026-01-02T03:04:00Z in ms
    assert m1["content_hash"] is None
    assert client.object(object_key).session("side").get_message("s1") == text_message("s1", "side session")

    with open_readonly(path) as conn:
        compactions = conn.execute(
            "SELECT session_id, id, seq, summary, from_message_id, to_message_id, created_at"
            " FROM cf_agents_session_compactions"
        ).fetchall()
        version = conn.execute("SELECT value FROM _cf_KV WHERE key = ?", (SCHEMA_VERSION_KEY,)).fetchone()
    assert [tuple(c) for c in compactions] == [("", "legacy-c1", 1, "summary text", "m1", "m2", 1_767_323_100_000)]
    assert version is not None and version[0] == SCHEMA_VERSION_1

    names = table_names(path)
    assert not {"assistant_messages", "assistant_compactions", "assistant_sessions"} & names
    assert "assistant_config" in names  # left for Think

    # appends continue after the lifted rows
    result = session.append_message(text_message("m4"))
    assert result.parent_id == "m3"
    assert message_rows(data_dir, object_key)[-1]["seq"] == 4


def test_incomplete_lift_keeps_the_source_and_the_version_unset(client: Any, live_server: Any, object_key: str) -> None:
    data_dir = Path(live_server.data_dir)
    path = object_file(data_dir, object_key)
    write_legacy_store(path, conflicting_row=True)
    session = client.object(object_key).session()

    session.get_history()  # opens the object

    names = table_names(path)
    assert "assistant_messages" in names  # not every row was copied faithfully: kept for a retry
    assert "assistant_sessions" not in names  # always dropped
    with open_readonly(path) as conn:
        version = conn.execute("SELECT value FROM _cf_KV WHERE key = ?", (SCHEMA_VERSION_KEY,)).fetchone()
    assert version is None
    # the pre-existing row was not overwritten; the others were copied
    rows = {r["id"]: r for r in message_rows(data_dir, object_key)}
    assert rows["m2"]["content"] == content("m2", "a different payload")
    assert {"m1", "m2", "m3"} <= set(rows)


def test_the_lift_indexes_legacy_text_past_a_nul_character(client: Any, live_server: Any, object_key: str) -> None:
    """The lift indexes legacy messages when the file has a search index. Its SQL read a text
    part as Debian's SQLite 3.40 does, ending it at a U+0000 (upstream's SQLite keeps the rest):
    "a\\u0000x nulword" was indexed as "a", and searches missed it."""
    data_dir = Path(live_server.data_dir)
    path = object_file(data_dir, object_key)
    write_legacy_store(path)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(FTS_DDL)
        conn.execute(
            "INSERT INTO assistant_messages (id, session_id, parent_id, role, content) VALUES (?, '', 'm3', 'user', ?)",
            ("nul", content("nul", "a\u0000x nulword")),
        )
    session = client.object(object_key).session()
    assert [hit.id for hit in session.search("nulword")] == ["nul"]
    with open_readonly(path) as conn:
        indexed = conn.execute("SELECT content FROM cf_agents_session_fts WHERE id = 'nul'").fetchall()
    assert [tuple(row) for row in indexed] == [("a\u0000x nulword",)]
