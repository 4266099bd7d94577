"""Upstream's file format, as read from a store written by agents@0.32.0 in workerd (the DDL text
of sqlite_master, the `_cf_KV` record). Used to check our files and to build upstream-written
files for the compatibility tests."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

SCHEMA_VERSION_KEY = "cf_agents:sessions_schema_version"
SCHEMA_VERSION_1 = bytes.fromhex("ff0f4902")  # V8-serialized int32 1, as workerd's KV stores it

UPSTREAM_DDL = {
    "_cf_KV": "CREATE TABLE _cf_KV ( key TEXT PRIMARY KEY, value BLOB ) WITHOUT ROWID",
    "cf_agents_session_attachment_chunks": (
        "CREATE TABLE cf_agents_session_attachment_chunks ( hash TEXT NOT NULL, idx INTEGER NOT NULL, "
        "data BLOB NOT NULL, PRIMARY KEY (hash, idx) ) WITHOUT ROWID"
    ),
    "cf_agents_session_attachment_meta": (
        "CREATE TABLE cf_agents_session_attachment_meta ( hash TEXT PRIMARY KEY, bytes INTEGER NOT NULL, "
        "media_type TEXT NOT NULL, chunks INTEGER NOT NULL ) WITHOUT ROWID"
    ),
    "cf_agents_session_attachment_refs": (
        "CREATE TABLE cf_agents_session_attachment_refs ( session_id TEXT NOT NULL, message_id TEXT NOT NULL, "
        "hash TEXT NOT NULL, PRIMARY KEY (session_id, message_id, hash) ) WITHOUT ROWID"
    ),
    "cf_agents_session_compactions": (
        "CREATE TABLE cf_agents_session_compactions ( session_id TEXT NOT NULL, id TEXT NOT NULL, "
        "seq INTEGER NOT NULL, summary TEXT NOT NULL, from_message_id TEXT NOT NULL, "
        "to_message_id TEXT NOT NULL, created_at INTEGER NOT NULL, PRIMARY KEY (session_id, id) ) WITHOUT ROWID"
    ),
    "cf_agents_session_config": (
        "CREATE TABLE cf_agents_session_config ( session_id TEXT NOT NULL, key TEXT NOT NULL, "
        "value TEXT NOT NULL, PRIMARY KEY (session_id, key) ) WITHOUT ROWID"
    ),
    "cf_agents_session_message_chunks": (
        "CREATE TABLE cf_agents_session_message_chunks ( session_id TEXT NOT NULL, id TEXT NOT NULL, "
        "idx INTEGER NOT NULL, content TEXT NOT NULL, PRIMARY KEY (session_id, id, idx) ) WITHOUT ROWID"
    ),
    "cf_agents_session_messages": (
        "CREATE TABLE cf_agents_session_messages ( session_id TEXT NOT NULL, id TEXT NOT NULL, "
        "seq INTEGER NOT NULL, parent_id TEXT, type TEXT NOT NULL DEFAULT 'message', role TEXT NOT NULL, "
        "content TEXT NOT NULL, content_chunks INTEGER NOT NULL DEFAULT 0, "
        "token_estimate INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, content_hash TEXT, "
        "PRIMARY KEY (session_id, id) ) WITHOUT ROWID"
    ),
}
UPSTREAM_TABLES = frozenset(UPSTREAM_DDL)

# agents 0.23 / 0.24 created the messages table without content_hash
MESSAGES_DDL_0_23 = (
    "CREATE TABLE cf_agents_session_messages ( session_id TEXT NOT NULL, id TEXT NOT NULL, "
    "seq INTEGER NOT NULL, parent_id TEXT, type TEXT NOT NULL DEFAULT 'message', role TEXT NOT NULL, "
    "content TEXT NOT NULL, content_chunks INTEGER NOT NULL DEFAULT 0, "
    "token_estimate INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, "
    "PRIMARY KEY (session_id, id) ) WITHOUT ROWID"
)


def normalized(sql: str) -> str:
    """DDL text with whitespace collapsed (SQLite keeps the text as written)."""
    return " ".join(sql.split()).replace("( ", "(").replace(" )", ")")


def object_file(data_dir: Path, object_key: str) -> Path:
    digest = hashlib.sha256(object_key.encode("utf-8")).hexdigest()
    return data_dir / "objects" / digest[0:2] / digest[2:4] / f"{digest}.sqlite"


def write_upstream_store(
    path: Path,
    rows: list[tuple[str, str, int, str | None, str, str, int]],
    *,
    with_content_hash: bool = True,
    page_size: int = 4096,
) -> None:
    """An object file as upstream writes it: 4 KiB pages, WAL, its DDL, the version record, and
    message rows (session_id, id, seq, parent_id, role, content, created_at), each stamped with
    token_estimate 6 (what upstream stamps for a one-word text message)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("PRAGMA journal_mode = WAL")
        for name, ddl in UPSTREAM_DDL.items():
            if name == "cf_agents_session_messages" and not with_content_hash:
                ddl = MESSAGES_DDL_0_23
            conn.execute(ddl)
        conn.execute("INSERT INTO _cf_KV (key, value) VALUES (?, ?)", (SCHEMA_VERSION_KEY, SCHEMA_VERSION_1))
        for session_id, message_id, seq, parent_id, role, content, created_at in rows:
            token_estimate = 6
            if with_content_hash:
                conn.execute(
                    "INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, "
                    "token_estimate, created_at, content_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        session_id,
                        message_id,
                        seq,
                        parent_id,
                        role,
                        content,
                        token_estimate,
                        created_at,
                        hashlib.sha256(content.encode()).hexdigest(),
                    ),
                )
            else:
                conn.execute(
                    "INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, "
                    "token_estimate, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, message_id, seq, parent_id, role, content, token_estimate, created_at),
                )
    finally:
        conn.close()
