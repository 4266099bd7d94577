"""Stored rows of an object on either side, in one comparable shape.

Upstream's rows come through the oracle's read-only `sql` op; ours straight from the object's
SQLite file (read-only connection beside the live server, which is fine under WAL).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conformance.harness.oracle import Oracle

MESSAGE_COLUMNS = (
    "session_id",
    "id",
    "seq",
    "parent_id",
    "type",
    "role",
    "content",
    "content_chunks",
    "token_estimate",
    "created_at",
    "content_hash",
)
MESSAGES_SQL = f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM cf_agents_session_messages ORDER BY session_id, id"
CHUNKS_SQL = "SELECT session_id, id, idx, content FROM cf_agents_session_message_chunks ORDER BY session_id, id, idx"
COMPACTIONS_SQL = (
    "SELECT session_id, id, seq, summary, from_message_id, to_message_id, created_at "
    "FROM cf_agents_session_compactions ORDER BY session_id, seq"
)
META_SQL = "SELECT hash, bytes, media_type, chunks FROM cf_agents_session_attachment_meta ORDER BY hash"
ATT_CHUNKS_SQL = (
    "SELECT hash, idx, length(data) AS n, hex(substr(data, 1, 32)) AS head "
    "FROM cf_agents_session_attachment_chunks ORDER BY hash, idx"
)
REFS_SQL = (
    "SELECT session_id, message_id, hash FROM cf_agents_session_attachment_refs ORDER BY session_id, message_id, hash"
)
CONFIG_SQL = "SELECT session_id, key, value FROM cf_agents_session_config ORDER BY session_id, key"

QUERIES = {
    "messages": MESSAGES_SQL,
    "chunks": CHUNKS_SQL,
    "compactions": COMPACTIONS_SQL,
    "attachment_meta": META_SQL,
    "attachment_chunks": ATT_CHUNKS_SQL,
    "attachment_refs": REFS_SQL,
    "config": CONFIG_SQL,
}


@dataclass
class Stored:
    """All rows of one object, per table: lists of dicts keyed by column name."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.tables.get("messages", [])

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return self.tables.get("chunks", [])

    def session_rows(self, session: str) -> list[dict[str, Any]]:
        return [r for r in self.messages if r["session_id"] == session]

    def row(self, session: str, message_id: str) -> dict[str, Any] | None:
        return next((r for r in self.messages if r["session_id"] == session and r["id"] == message_id), None)

    def full_content(self, session: str, message_id: str) -> str | None:
        """The reassembled stored JSON (slice 0 + continuation slices)."""
        row = self.row(session, message_id)
        if row is None:
            return None
        if not row["content_chunks"]:
            return str(row["content"])
        rest = [c["content"] for c in self.chunks if c["session_id"] == session and c["id"] == message_id]
        return str(row["content"]) + "".join(rest)

    def sessions(self) -> set[str]:
        return {r["session_id"] for r in self.messages}


def upstream_rows(oracle: Oracle, key: str, tables: Sequence[str] = tuple(QUERIES)) -> Stored:
    calls = [("", "sql", {"query": QUERIES[t]}) for t in tables]
    out = Stored()
    for table, (ok, result) in zip(tables, oracle.batch(key, calls), strict=True):
        if not ok:
            raise result
        out.tables[table] = [dict(r) for r in result]
    return out


def file_rows(path: Path, tables: Sequence[str] = tuple(QUERIES)) -> Stored:
    """Rows of a SQLite store file (ours, or an upstream file copy). Missing file: no rows."""
    out = Stored({t: [] for t in tables})
    if not path.exists():
        return out
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        existing = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in tables:
            source = {
                "messages": "cf_agents_session_messages",
                "chunks": "cf_agents_session_message_chunks",
                "compactions": "cf_agents_session_compactions",
                "attachment_meta": "cf_agents_session_attachment_meta",
                "attachment_chunks": "cf_agents_session_attachment_chunks",
                "attachment_refs": "cf_agents_session_attachment_refs",
                "config": "cf_agents_session_config",
            }[table]
            if source not in existing:
                continue
            out.tables[table] = [dict(r) for r in conn.execute(QUERIES[table])]
    finally:
        conn.close()
    return out


SEARCH_INDEX_SQL = "SELECT id, session_id, role, content FROM cf_agents_session_fts ORDER BY session_id, id, content"


def upstream_search_index(oracle: Oracle, key: str) -> list[tuple[Any, ...]]:
    """Rows of upstream's search index (the object must have one: it raises otherwise)."""
    return [tuple(r.values()) for r in oracle.sql(key, SEARCH_INDEX_SQL)]


def _has_search_index(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'cf_agents_session_fts'").fetchone() is not None


def file_has_search_index(path: Path) -> bool:
    """Whether a store file has a search index (an object never written has no file)."""
    if not path.exists():
        return False
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _has_search_index(conn)
    finally:
        conn.close()


def file_search_index(path: Path) -> list[tuple[Any, ...]]:
    """Rows of the search index of a store file; none without the file or the index."""
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [tuple(r) for r in conn.execute(SEARCH_INDEX_SQL)] if _has_search_index(conn) else []
    finally:
        conn.close()


def row_bytes(stored: Stored, session: str, message_id: str) -> int:
    """Upstream's row-stat `bytes`: UTF-8 size of the stored JSON plus base64 size of ref'd payloads."""
    content = stored.full_content(session, message_id) or ""
    total = len(content.encode("utf-8", "surrogatepass"))
    meta = {m["hash"]: m for m in stored.tables.get("attachment_meta", [])}
    for ref in stored.tables.get("attachment_refs", []):
        if ref["session_id"] == session and ref["message_id"] == message_id and ref["hash"] in meta:
            total += (int(meta[ref["hash"]]["bytes"]) + 2) // 3 * 4
    return total
