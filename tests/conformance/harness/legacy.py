"""Legacy (agents ≤ 0.22 `assistant_*`) store fixtures for the lift (reference notes §10).

The tables are written the way the old `agents/experimental/memory/session` code had them: a
global `id` primary key with rowids, DATETIME text timestamps, JSON content kept verbatim."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

LEGACY_DDL = [
    """CREATE TABLE assistant_messages (
        id TEXT PRIMARY KEY,
        session_id TEXT DEFAULT '',
        parent_id TEXT,
        role TEXT,
        content TEXT,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP
    )""",
    "CREATE INDEX idx_assistant_messages_parent ON assistant_messages(parent_id)",
    "CREATE INDEX idx_assistant_messages_session ON assistant_messages(session_id)",
    """CREATE TABLE assistant_compactions (
        id TEXT PRIMARY KEY,
        session_id TEXT DEFAULT '',
        summary TEXT,
        from_message_id TEXT,
        to_message_id TEXT,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP
    )""",
    """CREATE TABLE assistant_sessions (
        id TEXT PRIMARY KEY,
        name TEXT,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP,
        updated_at DATETIME DEFAULT CURRENT_TIMESTAMP
    )""",
    "CREATE VIRTUAL TABLE assistant_fts USING fts5(id UNINDEXED, session_id UNINDEXED, role UNINDEXED, content)",
    "CREATE TABLE assistant_config (key TEXT PRIMARY KEY, value TEXT)",
]


def _m(mid: str, text: str, role: str = "user") -> str:
    return json.dumps({"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}, separators=(",", ":"))


# (id, session_id, parent_id, role, content, created_at)
MESSAGES: list[tuple[str, str, str | None, str | None, str, str | None]] = [
    ("m1", "", None, "user", _m("m1", "first"), "2026-01-02 03:04:05"),
    ("m2", "", "m1", "assistant", _m("m2", "reply one", "assistant"), "2026-01-02 03:04:06"),
    ("m3", "", "m1", "assistant", _m("m3", "reply two (branch)", "assistant"), "2026-01-02 03:04:07"),
    (
        "m4",
        "",
        "m3",
        "user",
        '{ "id": "m4", "role": "user", "parts": [ {"type": "text", "text": "spaced JSON"} ] }',
        "2026-01-02 03:04:07",
    ),
    ("m5", "", "m4", "assistant", _m("m5", "unicode ü 😀 \u2028", "assistant"), "2026-01-02T03:05:00.000Z"),
    ("m6", "", "m5", "user", _m("m6", "after an overlay window"), "2026-01-02 03:06:00"),
    ("early", "", None, "user", _m("early", "null timestamp sorts first"), None),
    ("bad", "", "m6", "user", "not json at all", "2026-01-02 03:07:00"),
    ("noparts", "", "bad", "assistant", '{"id":"noparts","role":"assistant"}', "2026-01-02 03:08:00"),
    ("tail", "", "noparts", "user", _m("tail", "child of unparseable rows"), "2026-01-02 03:09:00"),
    ("a1", "s1", None, "user", _m("a1", "other session"), "2025-12-31 23:59:59"),
    ("a2", "s1", "a1", "assistant", _m("a2", "other session reply", "assistant"), "garbage date"),
    (
        "compaction_c-old",
        "s1",
        "a2",
        "assistant",
        _m("compaction_c-old", "echoed overlay", "assistant"),
        "2026-01-01 00:00:01",
    ),
    ("a3", "s1", "compaction_c-old", "user", _m("a3", "after the echoed overlay"), "2026-01-01 00:00:02"),
    ("a4", "s1", "a3", "user", _m("a4", "a\u0000x past a NUL"), "2026-01-01 00:00:03"),
]
COMPACTIONS = [
    ("c-main", "", "summary of m3..m4", "m3", "m4", "2026-01-02 03:05:00"),
    ("c-old", "s1", "summary of a1..a2", "a1", "a2", "2026-01-01 00:00:00"),
    ("c-off-path", "", "refers to missing rows", "zz1", "zz2", None),
]


def build_legacy_fixture(path: Path, *, conflicting_destination_row: bool = False) -> Path:
    """A store holding only legacy tables (plus, optionally, a destination row that conflicts with
    a legacy row's payload, which makes the lift incomplete: the source table is kept)."""
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        for ddl in LEGACY_DDL:
            conn.execute(ddl)
        conn.executemany("INSERT INTO assistant_messages VALUES (?, ?, ?, ?, ?, ?)", MESSAGES)
        conn.executemany("INSERT INTO assistant_compactions VALUES (?, ?, ?, ?, ?, ?)", COMPACTIONS)
        conn.execute("INSERT INTO assistant_sessions (id, name) VALUES ('', 'default'), ('s1', 'one')")
        conn.execute("INSERT INTO assistant_fts VALUES ('m1', '', 'user', 'first')")
        conn.execute("INSERT INTO assistant_config VALUES ('model', 'x')")
        if conflicting_destination_row:
            conn.execute(
                """CREATE TABLE cf_agents_session_messages (
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        parent_id TEXT,
        type TEXT NOT NULL DEFAULT 'message',
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        content_chunks INTEGER NOT NULL DEFAULT 0,
        token_estimate INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, id)
      ) WITHOUT ROWID"""
            )
            conn.execute(
                "INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at) "
                "VALUES ('', 'm2', 1, 'm1', 'assistant', ?, 5)",
                (_m("m2", "a different payload", "assistant"),),
            )
        conn.commit()
    finally:
        conn.close()
    return path


def build_null_role_fixture(path: Path) -> Path:
    """A legacy row with a NULL role cannot be copied (NOT NULL): the lift stays incomplete."""
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        for ddl in LEGACY_DDL:
            conn.execute(ddl)
        conn.executemany(
            "INSERT INTO assistant_messages VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("n1", "", None, "user", _m("n1", "ok"), "2026-01-02 03:04:05"),
                ("n2", "", "n1", None, _m("n2", "null role"), "2026-01-02 03:04:06"),
                ("n3", "", "n2", "user", _m("n3", "after"), "2026-01-02 03:04:07"),
            ],
        )
        conn.commit()
    finally:
        conn.close()
    return path
