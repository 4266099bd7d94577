"""The SQL of message storage, as functions of a connection.

Reads here run on any connection; writes assume the caller holds the object's write
transaction. The store (`store.py`) owns caches and transactions; what is kept here is a
connection's own knowledge of its file's search index (`ObjectConnection`'s flags).
"""

from __future__ import annotations

import heapq
import json
import operator
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sessions_server.storage.rows import (
    COMPACTION_PREFIX,
    MAX_PATH_DEPTH,
    Compaction,
    InlineTooLarge,
    NewRow,
    PathStat,
    PathStats,
    QueryRejected,
    RowInfo,
    StoredMessage,
    utf8_length,
)

# What a read or write job is handed (`ObjectStore.read`, `WriteContext.conn`): the domain names
# the type through storage, and imports no sqlite3 of its own.
Connection = sqlite3.Connection


class ObjectConnection(sqlite3.Connection):
    """A connection to an object file that remembers facts about its schema."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Once, before any statement: defining a function again expires the connection's
        # prepared statements, and fails while one of them is under way.
        self.create_function(JSON_TEXT_FUNCTION, 1, _json_text, deterministic=True)

    fts_known = False
    # Only the object's writer creates the index (`create_fts`), so only the writer may also
    # remember that it is absent: without that, every append looked it up (8 µs a message).
    creates_fts = False
    fts_absent = False
    fts_lookup_ensured = False


# Lifted columns cast in SQL (a file written elsewhere may hold any type in any column), so rows
# map to records without a Python conversion per field.
_INFO_COLUMNS = """CAST(id AS TEXT), CAST(role AS TEXT), CAST(parent_id AS TEXT), CAST(seq AS INTEGER),
    CAST(created_at AS INTEGER), CAST(token_estimate AS INTEGER)"""
_ROW_COLUMNS = f"{_INFO_COLUMNS}, content, content_chunks, content_hash"

# A stored `compaction_<X>` row is hidden when X names one of the session's own compaction
# records: it duplicates an overlay the session renders itself (reference notes §6).
_HIDDEN_SQL = f"""(substr({{id}}, 1, {len(COMPACTION_PREFIX)}) = '{COMPACTION_PREFIX}'
    AND EXISTS (SELECT 1 FROM cf_agents_session_compactions AS oc
                WHERE oc.session_id = {{session}} AND oc.id = substr({{id}}, {len(COMPACTION_PREFIX) + 1})))"""

# Stored size of a row as hydration costs it: slice 0, continuation slices, and (when the object
# holds any) each referenced attachment payload at its base64 length.
_ROW_BYTES_SQL = """LENGTH(CAST(m.content AS BLOB))
    + CASE WHEN m.content_chunks = 0 THEN 0 ELSE COALESCE((
        SELECT SUM(LENGTH(CAST(c.content AS BLOB))) FROM cf_agents_session_message_chunks AS c
        WHERE c.session_id = m.session_id AND c.id = m.id), 0) END"""
_ATTACHMENT_BYTES_SQL = """ + COALESCE((
        SELECT SUM((meta.bytes + 2) / 3 * 4) FROM cf_agents_session_attachment_refs AS r
        JOIN cf_agents_session_attachment_meta AS meta ON meta.hash = r.hash
        WHERE r.session_id = m.session_id AND r.message_id = m.id), 0)"""


def _stats_cte(with_attachments: bool) -> str:
    """The path walk carrying each row's role, stored bytes and token estimate: computed where
    the walk already stands on the row, which costs half of joining the rows again after."""
    row = f"m.role, {_ROW_BYTES_SQL}{_ATTACHMENT_BYTES_SQL if with_attachments else ''}, m.token_estimate"
    return f"""WITH RECURSIVE path(id, parent_id, depth, role, bytes, tokens) AS (
    SELECT m.id, m.parent_id, 0, {row} FROM cf_agents_session_messages AS m
    WHERE m.session_id = ?1 AND m.id = ?2
    UNION ALL
    SELECT m.id, m.parent_id, path.depth + 1, {row}
    FROM path JOIN cf_agents_session_messages AS m ON m.session_id = ?1 AND m.id = path.parent_id
    WHERE path.depth < {MAX_PATH_DEPTH}
)"""


_STATS_CTE = {flag: _stats_cte(flag) for flag in (False, True)}


def _info(row: Sequence[Any]) -> RowInfo:
    """A row selected as `_INFO_COLUMNS` (types already cast) as a record."""
    return RowInfo(row[0], row[1], row[2], row[3], row[4], row[5])


def continuations(conn: sqlite3.Connection, session_id: str, ids: Sequence[str]) -> dict[str, str]:
    """Continuation slices joined in idx order, for ids known to have them; one query."""
    if not ids:
        return {}
    placeholders = ",".join("?" * len(ids))
    joined: dict[str, list[str]] = {}
    for message_id, content in conn.execute(
        f"""SELECT id, content FROM cf_agents_session_message_chunks
            WHERE session_id = ? AND id IN ({placeholders}) ORDER BY id, idx""",
        (session_id, *ids),
    ):
        joined.setdefault(message_id, []).append(content)
    return {message_id: "".join(parts) for message_id, parts in joined.items()}


def _assemble(conn: sqlite3.Connection, session_id: str, rows: list[Sequence[Any]]) -> list[StoredMessage]:
    chunked = [row[0] for row in rows if row[7]]
    extra = continuations(conn, session_id, chunked) if chunked else {}
    out = []
    for row in rows:
        content = str(row[6])
        if row[7]:
            content += extra.get(row[0], "")
        out.append(StoredMessage(_info(row), content, row[8] is not None))
    return out


def get_message(conn: sqlite3.Connection, session_id: str, message_id: str) -> StoredMessage | None:
    """One row, reassembled, or None."""
    row = conn.execute(
        f"SELECT {_ROW_COLUMNS} FROM cf_agents_session_messages WHERE session_id = ? AND id = ?",
        (session_id, message_id),
    ).fetchone()
    if row is None:
        return None
    return _assemble(conn, session_id, [row])[0]


_ANCESTOR_COLUMNS = "id, role, parent_id, seq, created_at, token_estimate, content, content_chunks, content_hash"


def _ancestors_sql(with_attachments: bool) -> str:
    """The walk up the parent pointers, carrying the stored bytes taken so far: a row joins
    only while the total stays within ?4 (the first row always does)."""
    columns = ", ".join("m." + column for column in _ANCESTOR_COLUMNS.split(", "))
    row_bytes = _ROW_BYTES_SQL + (_ATTACHMENT_BYTES_SQL if with_attachments else "")
    return f"""WITH RECURSIVE up({_ANCESTOR_COLUMNS}, depth, total) AS (
    SELECT {columns}, 1, {row_bytes} FROM cf_agents_session_messages AS m WHERE m.session_id = ?1 AND m.id = ?2
    UNION ALL
    SELECT {columns}, up.depth + 1, up.total + {row_bytes}
    FROM up JOIN cf_agents_session_messages AS m ON m.session_id = ?1 AND m.id = up.parent_id
    WHERE up.depth < ?3 AND up.total + {row_bytes} <= ?4
) SELECT {_ROW_COLUMNS} FROM up ORDER BY depth"""


_ANCESTORS_SQL = {flag: _ancestors_sql(flag) for flag in (False, True)}


def ancestors(
    conn: sqlite3.Connection, session_id: str, message_id: str, count: int, max_bytes: int, *, with_attachments: bool
) -> list[StoredMessage]:
    """Up to `count` rows: `message_id`'s, its parent's, and so on up the parent pointers, in
    that order, reassembled, of at most `max_bytes` of stored bytes in all (`stored_bytes`; a
    larger first row alone). Fewer when the chain reaches a root or a missing row, or the next
    row would pass `max_bytes`. One statement: a point read per row costs twice as much in
    statement overhead as the lookups themselves."""
    if count <= 0:
        return []
    rows = conn.execute(_ANCESTORS_SQL[with_attachments], (session_id, message_id, count, max_bytes)).fetchall()
    return _assemble(conn, session_id, rows)


def get_messages(conn: sqlite3.Connection, session_id: str, ids: Sequence[str]) -> dict[str, StoredMessage]:
    """A window of rows by id: one query for the rows, one for continuations if any have them."""
    if not ids:
        return {}
    unique = list(dict.fromkeys(ids))
    placeholders = ",".join("?" * len(unique))
    rows = conn.execute(
        f"""SELECT {_ROW_COLUMNS} FROM cf_agents_session_messages
            WHERE session_id = ? AND id IN ({placeholders})""",
        (session_id, *unique),
    ).fetchall()
    return {m.info.id: m for m in _assemble(conn, session_id, rows)}


def stored_bytes(
    conn: sqlite3.Connection, session_id: str, ids: Sequence[str], *, with_attachments: bool
) -> dict[str, int]:
    """Each found row's stored bytes as hydration costs them (continuations included, and the
    payloads it references when `with_attachments`), without reading it whole."""
    if not ids:
        return {}
    unique = list(dict.fromkeys(ids))
    extra = _ATTACHMENT_BYTES_SQL if with_attachments else ""
    return {
        str(r[0]): int(r[1])
        for r in conn.execute(
            f"""SELECT m.id, {_ROW_BYTES_SQL}{extra} FROM cf_agents_session_messages AS m
                WHERE m.session_id = ? AND m.id IN ({",".join("?" * len(unique))})""",
            (session_id, *unique),
        )
    }


def exists(conn: sqlite3.Connection, session_id: str, message_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM cf_agents_session_messages WHERE session_id = ? AND id = ?", (session_id, message_id)
    ).fetchone()
    return row is not None


def seqs_of(conn: sqlite3.Connection, session_id: str, ids: Sequence[str]) -> dict[str, int]:
    """The seq of each of `ids` (distinct) that is a message of the session."""
    marks = ",".join("?" * len(ids))
    rows = conn.execute(
        f"SELECT id, seq FROM cf_agents_session_messages WHERE session_id = ? AND id IN ({marks})",
        (session_id, *ids),
    ).fetchall()
    return {str(message_id): int(seq) for message_id, seq in rows}


def parent_of(conn: sqlite3.Connection, session_id: str, message_id: str) -> tuple[bool, str | None]:
    """(exists, parent_id) of one row."""
    row = conn.execute(
        "SELECT parent_id FROM cf_agents_session_messages WHERE session_id = ? AND id = ?",
        (session_id, message_id),
    ).fetchone()
    return (False, None) if row is None else (True, row[0])


def newest_row(conn: sqlite3.Connection, session_id: str) -> tuple[str, int] | None:
    """(id, seq) of the session's max-seq row: the active leaf (one seek of the seq index)."""
    row = conn.execute(
        "SELECT id, seq FROM cf_agents_session_messages WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def children(conn: sqlite3.Connection, session_id: str, parent_id: str) -> list[tuple[str, int]]:
    """(id, seq) of the direct children in seq order (hidden overlay rows are the caller's
    business); reading them is another's, a window at a time."""
    # One seek of `_sessions_messages_by_parent` (session_id, parent_id, seq; the key's `id` rides
    # along), which covers the query and holds the children in this order: no row of the session
    # is read (it read all of them, ~37 ms at 100,000 messages). `id` breaks seq ties as the old
    # plan did (rows in key order, sorted by seq), and the index gives it without a sort.
    return [
        (str(r[0]), int(r[1]))
        for r in conn.execute(
            """SELECT id, seq FROM cf_agents_session_messages
                WHERE session_id = ? AND parent_id = ? ORDER BY seq ASC, id ASC""",
            (session_id, parent_id),
        )
    ]


def has_attachment_refs(conn: sqlite3.Connection, session_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM cf_agents_session_attachment_refs WHERE session_id = ? LIMIT 1", (session_id,)
    ).fetchone()
    return row is not None


def has_compactions(conn: sqlite3.Connection, session_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM cf_agents_session_compactions WHERE session_id = ? LIMIT 1", (session_id,)
    ).fetchone()
    return row is not None


def path_stats(conn: sqlite3.Connection, session_id: str, leaf_id: str) -> PathStats:
    """The path from the root to `leaf_id` without content, hidden overlay rows left out."""
    # Without compaction records nothing can be hidden, and without attachment references no
    # row has payload bytes: each per-row test left out is a fifth of the walk.
    hidden = _HIDDEN_SQL.format(id="path.id", session="?1") if has_compactions(conn, session_id) else "0"
    with_refs = has_attachment_refs(conn, session_id)
    walked = conn.execute(
        f"{_STATS_CTE[with_refs]} SELECT id, role, bytes, tokens, {hidden} FROM path ORDER BY depth DESC",
        (session_id, leaf_id),
    ).fetchall()
    rows = [PathStat(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in walked if not r[4]]
    dangling = with_refs and conn.execute(_DANGLING_REF_SQL, (session_id,)).fetchone() is not None
    oldest = str(walked[0][0]) if walked else None
    # Short of the cap, the walk ends at a root or at a parent no row holds.
    open_parent = None
    if oldest is not None and len(walked) <= MAX_PATH_DEPTH:
        open_parent = parent_of(conn, session_id, oldest)[1]
    return PathStats(rows, len(walked), oldest, dangling, open_parent)


_DANGLING_REF_SQL = """SELECT 1 FROM cf_agents_session_attachment_refs AS r WHERE r.session_id = ?
    AND NOT EXISTS (SELECT 1 FROM cf_agents_session_attachment_meta AS meta WHERE meta.hash = r.hash) LIMIT 1"""


def _session_compactions(conn: sqlite3.Connection, session_id: str, columns: str) -> Iterator[Sequence[Any]]:
    """`columns` of a session's compaction records, in key order: one seek to the session's first
    key, then rows until another session's. Not `WHERE session_id = ?`: SQLite ends such a range
    by comparing each row's key record, which in this WITHOUT ROWID table is the whole row, so
    every summary was read whole from its overflow pages (200 of 3 MiB: 127 ms a query, against
    3 ms so). Columns stored after the summary (from, to, created_at) still make SQLite walk its
    overflow pages, but none of it is copied or handed to Python."""
    cursor = conn.execute(
        f"""SELECT session_id, {columns} FROM cf_agents_session_compactions
            WHERE session_id >= ? ORDER BY session_id""",
        (session_id,),
    )
    try:
        for row in cursor:
            if row[0] != session_id:
                return
            yield row[1:]
    finally:
        cursor.close()


def compaction_ids(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """The ids of a session's compaction records (without their summaries, which can be large)."""
    return [str(r[0]) for r in _session_compactions(conn, session_id, "id")]


@dataclass(frozen=True, slots=True)
class CompactionSpan:
    """A compaction record without its summary: what planning overlays needs (ids, span, order).
    Summaries can take 3 MiB each and a session may hold any number of records, so reads plan
    with these and read a summary by id (`compaction_summary`) only as its overlay is sent."""

    id: str
    seq: int
    from_message_id: str
    to_message_id: str
    created_at_ms: int


def compaction_spans(conn: sqlite3.Connection, session_id: str) -> list[CompactionSpan]:
    """Every compaction record of a session without its summary, oldest (lowest seq) first
    (records of one seq, which only a file made elsewhere holds, in id order)."""
    spans = [
        CompactionSpan(str(r[0]), int(r[1]), str(r[2]), str(r[3]), int(r[4]))
        for r in _session_compactions(conn, session_id, "id, seq, from_message_id, to_message_id, created_at")
    ]
    spans.sort(key=_SEQ)
    return spans


_SEQ = operator.attrgetter("seq")


def compaction_summary(conn: sqlite3.Connection, session_id: str, compaction_id: str) -> str | None:
    """One record's summary (a point read by key), or None when the session holds no such record."""
    row = conn.execute(
        "SELECT summary FROM cf_agents_session_compactions WHERE session_id = ? AND id = ?",
        (session_id, compaction_id),
    ).fetchone()
    return None if row is None else str(row[0])


def compactions_after(
    conn: sqlite3.Connection, session_id: str, after_seq: int, limit: int, max_bytes: int
) -> tuple[list[Compaction], bool]:
    """A page of a session's records after `after_seq`, lowest seq first: at most `limit`, and
    past the first, no more than `max_bytes` of text (counted in characters: a bound on what is
    read, which the caller measures exactly). True when more records follow.

    The page's ids are chosen first from the small columns alone (the table has no index on
    seq: SQLite's sort of whole rows sorted every summary of the session, for every page: 200
    pages of a record of 3 MiB took 179 s), and only its records are then read whole, one by
    key at a time."""
    keys = ((int(r[0]), str(r[1])) for r in _session_compactions(conn, session_id, "seq, id"))
    ids = [record_id for _, record_id in heapq.nsmallest(limit + 1, (key for key in keys if key[0] > after_seq))]
    page: list[Compaction] = []
    size = 0
    for index, record_id in enumerate(ids):
        if index == limit:
            return page, True
        r = conn.execute(
            """SELECT id, seq, summary, from_message_id, to_message_id, created_at
               FROM cf_agents_session_compactions WHERE session_id = ? AND id = ?""",
            (session_id, record_id),
        ).fetchone()
        if r is None:
            continue  # removed since its id was read (a clear)
        record = Compaction(str(r[0]), int(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]))
        size += len(record.summary) + len(record.id) + len(record.from_message_id) + len(record.to_message_id)
        if page and size > max_bytes:
            return page, True
        page.append(record)
    return page, False


_INSERT_MESSAGE_SQL = """INSERT INTO cf_agents_session_messages
      (session_id, id, seq, parent_id, role, content, content_chunks, token_estimate, created_at, content_hash)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT DO NOTHING"""
# The content goes in through `_indexable`: a text holding a lone UTF-16 surrogate (valid in JSON,
# "\ud83d") is bound as its UTF-8 bytes with the surrogate encoded as such, and stored as TEXT,
# as upstream's runtime stores it; Python's sqlite3 refuses to bind it as a string.
_INSERT_SEARCH_ROW_SQL = (
    "INSERT INTO cf_agents_session_fts (id, session_id, role, content) VALUES (?, ?, ?, CAST(? AS TEXT))"
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _indexable(text: str) -> str | bytes:
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
    return text


def _indexed_text(stored: bytes | None) -> str:
    """An index row's content as read back (`CAST(content AS BLOB)`): a lone surrogate stored
    by upstream or by `_indexable` becomes U+FFFD (a protobuf string holds only valid UTF-8)."""
    if stored is None:
        return ""
    try:
        return stored.decode("utf-8")
    except UnicodeDecodeError:
        return _LONE_SURROGATE.sub("\ufffd", stored.decode("utf-8", "surrogatepass"))


def insert_message(
    conn: sqlite3.Connection,
    session_id: str,
    row: NewRow,
    *,
    seq: int,
    parent_id: str | None,
    created_at_ms: int,
) -> int | None:
    """Writes a message unless its id is taken in the session: then it writes nothing, not even
    payloads, and returns None. Otherwise the rows written (what upstream's billing counts).
    The row goes first, so a fresh id, the common case, costs no separate probe."""
    check_inline_size(conn, row)
    inserted = conn.execute(
        _INSERT_MESSAGE_SQL,
        (
            session_id,
            row.id,
            seq,
            parent_id,
            row.role,
            row.slices[0],
            len(row.slices) - 1,
            row.token_estimate,
            created_at_ms,
            row.digest,
        ),
    ).rowcount
    if not inserted:
        return None
    written = put_payloads(conn, session_id, row) + len(row.slices)
    write_continuations(conn, session_id, row.id, row.slices)
    written += add_refs(conn, session_id, row.id, row.references)
    written += index_search_text(conn, session_id, row.id, row.role, row.search_text, replace=False)
    return written


def insert_plain_chain(
    conn: sqlite3.Connection,
    session_id: str,
    rows: Sequence[NewRow],
    parents: Sequence[str | None],
    first_seq: int,
    created_at_ms: Sequence[int],
) -> int | None:
    """Writes rows of one slice and no attachments (`plain_row`) in one statement, the i-th with
    `parents[i]`, `created_at_ms[i]` and seq `first_seq + i`, and their search rows when the
    index exists; returns the rows written. Only when every id is fresh: else it writes nothing
    and returns None (the caller goes row by row, which tells the inserted from the present).
    Inside a transaction."""
    values = [
        (
            session_id,
            row.id,
            first_seq + index,
            parents[index],
            row.role,
            row.slices[0],
            0,
            row.token_estimate,
            created_at_ms[index],
            row.digest,
        )
        for index, row in enumerate(rows)
    ]
    if len(rows) == 1:  # a taken id inserts nothing: nothing to undo
        if not conn.execute(_INSERT_MESSAGE_SQL, values[0]).rowcount:
            return None
    else:
        conn.execute("SAVEPOINT plain_chain")
        if conn.executemany(_INSERT_MESSAGE_SQL, values).rowcount != len(rows):
            conn.execute("ROLLBACK TO plain_chain")
            conn.execute("RELEASE plain_chain")
            return None
        conn.execute("RELEASE plain_chain")
    if not fts_exists(conn):
        return len(rows)
    searchable = [(row.id, session_id, row.role, _indexable(row.search_text)) for row in rows if row.search_text]
    conn.executemany(_INSERT_SEARCH_ROW_SQL, searchable)
    return len(rows) + len(searchable)


def plain_row(row: NewRow) -> bool:
    """Whether `insert_plain_chain` can write the row: one slice, no payloads, no references."""
    return len(row.slices) == 1 and not row.payloads and not row.references


def write_continuations(conn: sqlite3.Connection, session_id: str, message_id: str, slices: Sequence[str]) -> None:
    if len(slices) > 1:
        conn.executemany(
            """INSERT OR REPLACE INTO cf_agents_session_message_chunks (session_id, id, idx, content)
               VALUES (?, ?, ?, ?)""",
            # One slice at a time: a large message's slices may be cut from it only as they go in.
            ((session_id, message_id, idx, slices[idx]) for idx in range(1, len(slices))),
        )


def update_key_columns(conn: sqlite3.Connection, session_id: str, message_id: str) -> tuple[int, str | None] | None:
    """(content_chunks, content_hash) of a row, without its content; None when missing."""
    row = conn.execute(
        """SELECT content_chunks, content_hash FROM cf_agents_session_messages
           WHERE session_id = ? AND id = ?""",
        (session_id, message_id),
    ).fetchone()
    return None if row is None else (int(row[0]), row[1])


def stamp_digest(conn: sqlite3.Connection, session_id: str, message_id: str, digest: str) -> None:
    conn.execute(
        "UPDATE cf_agents_session_messages SET content_hash = ? WHERE session_id = ? AND id = ?",
        (digest, session_id, message_id),
    )


def rewrite_message(conn: sqlite3.Connection, session_id: str, row: NewRow, old_chunks: int) -> int:
    """Replaces a row's content in place (parent, seq and created time stay): payloads first,
    then the row, surplus continuations, continuations, references, search row. Returns rows
    written."""
    check_inline_size(conn, row)
    written = put_payloads(conn, session_id, row)
    conn.execute(
        """UPDATE cf_agents_session_messages
           SET role = ?, content = ?, content_chunks = ?, token_estimate = ?, content_hash = ?
           WHERE session_id = ? AND id = ?""",
        (row.role, row.slices[0], len(row.slices) - 1, row.token_estimate, row.digest, session_id, row.id),
    )
    if old_chunks > len(row.slices) - 1:
        written += conn.execute(
            "DELETE FROM cf_agents_session_message_chunks WHERE session_id = ? AND id = ? AND idx > ?",
            (session_id, row.id, len(row.slices) - 1),
        ).rowcount
    write_continuations(conn, session_id, row.id, row.slices)
    written += len(row.slices)
    written += replace_refs(conn, session_id, row.id, row.references)
    written += index_search_text(conn, session_id, row.id, row.role, row.search_text, replace=True)
    return written


def row_info(conn: sqlite3.Connection, session_id: str, message_id: str) -> RowInfo | None:
    row = conn.execute(
        f"SELECT {_INFO_COLUMNS} FROM cf_agents_session_messages WHERE session_id = ? AND id = ?",
        (session_id, message_id),
    ).fetchone()
    return None if row is None else _info(row)


def delete_messages(conn: sqlite3.Connection, session_id: str, ids: Sequence[str]) -> tuple[int, int]:
    """Deletes rows, re-parenting each surviving child of a deleted row to its nearest surviving
    ancestor (or NULL), then rows, continuations and attachment references. Returns the message
    rows deleted, and every row written (as upstream bills them: re-parented children,
    continuations, references, payloads and search rows too)."""
    if not ids:
        return 0, 0
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (id TEXT PRIMARY KEY) WITHOUT ROWID")
    conn.execute("DELETE FROM temp.doomed")
    conn.executemany("INSERT OR IGNORE INTO temp.doomed (id) VALUES (?)", [(i,) for i in ids])
    # The children of the doomed rows are found through `_sessions_messages_by_parent`, one
    # seek per doomed id (without it, a scan of the whole session under the write lock). Each
    # step of a climb is to a doomed row, so a climb longer than there are doomed ids goes round
    # a cycle (an import's): bounded so, not by the path cap, as upstream's is. Past that cap a
    # child kept the id of a deleted parent, which an append of that id later made its parent
    # again: a cycle.
    conn.execute(
        """WITH RECURSIVE climb(child_id, ancestor_id, depth) AS (
              SELECT child.id, child.parent_id, 0
              FROM cf_agents_session_messages AS child
              WHERE child.session_id = ?1
                AND child.parent_id IN (SELECT id FROM temp.doomed)
                AND child.id NOT IN (SELECT id FROM temp.doomed)
              UNION ALL
              SELECT climb.child_id, up.parent_id, climb.depth + 1
              FROM climb JOIN cf_agents_session_messages AS up
                ON up.session_id = ?1 AND up.id = climb.ancestor_id
              WHERE up.id IN (SELECT id FROM temp.doomed) AND climb.depth < ?2
            ),
            landing(child_id, ancestor_id) AS (
              SELECT child_id, ancestor_id FROM climb
              WHERE ancestor_id IS NULL OR ancestor_id NOT IN (SELECT id FROM temp.doomed)
            )
            UPDATE cf_agents_session_messages
            SET parent_id = (SELECT landing.ancestor_id FROM landing
                             WHERE landing.child_id = cf_agents_session_messages.id)
            WHERE session_id = ?1 AND id IN (SELECT child_id FROM landing)""",
        (session_id, len(set(ids))),
    )
    # The module's rowcount is -1 for a statement that starts with WITH: SQLite's own count.
    reparented = int(conn.execute("SELECT changes()").fetchone()[0])
    deleted = conn.execute(
        """DELETE FROM cf_agents_session_messages
           WHERE session_id = ? AND id IN (SELECT id FROM temp.doomed)""",
        (session_id,),
    ).rowcount
    written = reparented + deleted
    written += conn.execute(
        """DELETE FROM cf_agents_session_message_chunks
           WHERE session_id = ? AND id IN (SELECT id FROM temp.doomed)""",
        (session_id,),
    ).rowcount
    written += release_refs(conn, session_id, "message_id IN (SELECT id FROM temp.doomed)")
    if fts_exists(conn):
        written += _delete_search_rows(
            conn,
            "SELECT f.id FROM cf_agents_session_fts_content AS f JOIN temp.doomed AS d ON f.c0 = d.id WHERE f.c1 = ?",
            (session_id,),
        )
    conn.execute("DELETE FROM temp.doomed")
    return int(deleted), int(written)


def clear_session(conn: sqlite3.Connection, session_id: str) -> tuple[int, int]:
    """Deletes a session's messages, continuations, compactions, references and index rows.
    Returns the message rows deleted, and every row written (see `delete_messages`)."""
    deleted = conn.execute("DELETE FROM cf_agents_session_messages WHERE session_id = ?", (session_id,)).rowcount
    written = deleted
    written += conn.execute("DELETE FROM cf_agents_session_message_chunks WHERE session_id = ?", (session_id,)).rowcount
    written += conn.execute("DELETE FROM cf_agents_session_compactions WHERE session_id = ?", (session_id,)).rowcount
    written += release_refs(conn, session_id, "1")
    if fts_exists(conn):
        written += _delete_search_rows(conn, "SELECT id FROM cf_agents_session_fts_content WHERE c1 = ?", (session_id,))
    return int(deleted), int(written)


def release_refs(conn: sqlite3.Connection, session_id: str, message_filter: str) -> int:
    """Drops attachment references of the selected messages and collects unreferenced payloads.
    Rows written."""
    candidates = [
        str(r[0])
        for r in conn.execute(
            f"""SELECT DISTINCT hash FROM cf_agents_session_attachment_refs
                WHERE session_id = ? AND {message_filter}""",
            (session_id,),
        )
    ]
    if not candidates:
        return 0
    written = conn.execute(
        f"DELETE FROM cf_agents_session_attachment_refs WHERE session_id = ? AND {message_filter}",
        (session_id,),
    ).rowcount
    return int(written) + collect_payloads(conn, candidates)


def collect_payloads(conn: sqlite3.Connection, hashes: Iterable[str]) -> int:
    """Deletes payloads that no reference in any session points at any more. Rows written."""
    written = 0
    for digest in hashes:
        if conn.execute("SELECT 1 FROM cf_agents_session_attachment_refs WHERE hash = ? LIMIT 1", (digest,)).fetchone():
            continue
        written += conn.execute("DELETE FROM cf_agents_session_attachment_chunks WHERE hash = ?", (digest,)).rowcount
        written += conn.execute("DELETE FROM cf_agents_session_attachment_meta WHERE hash = ?", (digest,)).rowcount
    return written


def fts_exists(conn: sqlite3.Connection) -> bool:
    """Whether the search index exists. Remembered per connection once it does: it is never
    dropped, and only this process creates it (on the writer, see `create_fts`). The writer also
    remembers its absence, until it creates it."""
    if getattr(conn, "fts_known", False):
        return True
    if getattr(conn, "fts_absent", False):
        return False
    present = (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'cf_agents_session_fts'").fetchone()
        is not None
    )
    if present and not conn.in_transaction:  # inside a transaction it could still roll back
        remember_fts(conn)
    elif not present and getattr(conn, "creates_fts", False):
        conn.fts_absent = True  # type: ignore[attr-defined]
    return present


def merge_search_index(conn: sqlite3.Connection) -> None:
    """Merges the search index's segments into one, leaving out the entries of rows deleted or
    replaced since: FTS5 records a delete as an entry of its own until segments merge (after
    95% of a session was deleted, 8.4 MB of index held 251 messages' words; merged, 0.42 MB)."""
    if fts_exists(conn):
        conn.execute("INSERT INTO cf_agents_session_fts (cf_agents_session_fts) VALUES ('optimize')")


def forget_uncommitted(conn: sqlite3.Connection) -> None:
    """After the writer rolled back (a job, or its whole transaction): what it noted while the
    transaction ran may be gone with it, so it looks again. `fts_known` is noted only after a
    commit and stays."""
    if isinstance(conn, ObjectConnection):
        conn.fts_lookup_ensured = False
        conn.fts_absent = False


def remember_fts(conn: sqlite3.Connection) -> None:
    """Records, after the index's creation committed, that `conn` need not look it up again."""
    if isinstance(conn, ObjectConnection):
        conn.fts_known = True


# ── attachments ──────────────────────────────────────────────────────────────

# Payload chunks share the row budget: an immutable payload in big rows costs few billed writes.
ATTACHMENT_CHUNK_BYTES = 1_572_864


def check_inline_size(conn: sqlite3.Connection, row: NewRow) -> None:
    """Raises InlineTooLarge when `row` would read back, its payloads put back inline at each
    place its stored form names them, as more than `row.max_inline_bytes`."""
    if not row.max_inline_bytes or not row.references:
        return
    sizes = {payload.hash: len(payload.data) for payload in row.payloads}
    known = [digest for digest in row.references if digest not in sizes]
    for start in range(0, len(known), 500):
        chunk = known[start : start + 500]
        placeholders = ",".join("?" * len(chunk))
        sizes.update(
            conn.execute(
                f"SELECT hash, bytes FROM cf_agents_session_attachment_meta WHERE hash IN ({placeholders})", chunk
            ).fetchall()
        )
    inline = sum(map(utf8_length, row.slices))
    uses = row.reference_uses or (1,) * len(row.references)
    for digest, count in zip(row.references, uses, strict=True):
        inline += count * (int(sizes.get(digest, 0)) + 2) // 3 * 4  # base64, as a read restores it
    if inline > row.max_inline_bytes:
        raise InlineTooLarge(row.id, inline, row.max_inline_bytes)


def put_payloads(conn: sqlite3.Connection, session_id: str, row: NewRow, *, named_only: bool = False) -> int:
    """Stores the payloads of `row` not yet present (first writer wins, media type included).
    `named_only`: `row` itself is not written (its id is taken, or it is unchanged), and only
    payloads that stored messages name are stored (a pointer copied from another object,
    written before its bytes): else they would be nobody's. Rows written.

    Raises InlineTooLarge when a stored message that named a payload before the object held it
    would read back with it past `row.max_inline_bytes`: that message was measured without it.
    The row being written is not one of them: `check_inline_size` measures it as written."""
    written = 0
    sizes = {payload.hash: len(payload.data) for payload in row.payloads}
    for payload in row.payloads:
        if conn.execute("SELECT 1 FROM cf_agents_session_attachment_meta WHERE hash = ?", (payload.hash,)).fetchone():
            continue
        named_by = conn.execute(
            "SELECT session_id, message_id FROM cf_agents_session_attachment_refs WHERE hash = ?", (payload.hash,)
        ).fetchall()
        if named_only and not named_by:
            continue
        for named_session, named_id in named_by:
            if named_only or (named_session, named_id) != (session_id, row.id):
                _check_grown(conn, str(named_session), str(named_id), row, sizes)
        chunks = 0
        for start in range(0, len(payload.data), ATTACHMENT_CHUNK_BYTES):
            conn.execute(
                "INSERT INTO cf_agents_session_attachment_chunks (hash, idx, data) VALUES (?, ?, ?)",
                (payload.hash, chunks, payload.data[start : start + ATTACHMENT_CHUNK_BYTES]),
            )
            chunks += 1
        conn.execute(
            """INSERT INTO cf_agents_session_attachment_meta (hash, bytes, media_type, chunks)
               VALUES (?, ?, ?, ?)""",
            (payload.hash, len(payload.data), payload.media_type, chunks),
        )
        written += chunks + 1
    return written


def _check_grown(conn: sqlite3.Connection, session_id: str, message_id: str, row: NewRow, new: dict[str, int]) -> None:
    """Raises InlineTooLarge when the stored message would read back past `row.max_inline_bytes`
    with the payloads `new` (hash: bytes) beside those the object holds."""
    if not row.max_inline_bytes or row.restored_pointers is None:
        return
    stored = get_message(conn, session_id, message_id)
    if stored is None:
        return
    named = row.restored_pointers(stored.content)
    sizes = dict(new)
    sizes.update(
        (str(digest), int(size))
        for digest in set(named) - sizes.keys()
        for (size,) in conn.execute("SELECT bytes FROM cf_agents_session_attachment_meta WHERE hash = ?", (digest,))
    )
    inline = utf8_length(stored.content) + sum((sizes.get(digest, 0) + 2) // 3 * 4 for digest in named)
    if inline > row.max_inline_bytes:
        raise InlineTooLarge(row.id, inline, row.max_inline_bytes, grown=(session_id, message_id))


_POINTER_TEXT = re.compile(r"attachment:sha256:([0-9a-f]{64})")
_FULL_POINTER = re.compile(r"attachment:sha256:([0-9a-f]{64})\Z")


def named_hashes(stored_json: str) -> set[str]:
    """Every attachment hash a message's stored JSON could name: each pointer's text anywhere in
    it, escapes undone. More than a read restores (that looks at media records' `url` and
    `data` only, above a depth): a reference kept for one of the others keeps a payload alive
    while its message is, never drops one a message needs."""
    if "\\u" not in stored_json:
        return set(_POINTER_TEXT.findall(stored_json))
    try:
        value = json.loads(stored_json)
    except (ValueError, RecursionError):
        return set(_POINTER_TEXT.findall(stored_json))
    found: set[str] = set()
    pending = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            if (match := _FULL_POINTER.match(node)) is not None:
                found.add(match.group(1))
        elif isinstance(node, dict):
            pending.extend(node.keys())
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def stored_json_of(conn: sqlite3.Connection, session_id: Any, message_id: Any, content: Any, chunks: Any) -> str:
    """A message's stored JSON: its row's content, then its continuation rows'."""
    text = str(content)
    if chunks:
        text += "".join(
            str(piece)
            for (piece,) in conn.execute(
                "SELECT content FROM cf_agents_session_message_chunks WHERE session_id = ? AND id = ? ORDER BY idx",
                (session_id, message_id),
            )
        )
    return text


def reconcile_attachment_refs(conn: sqlite3.Connection) -> None:
    """Makes the attachment references say which messages name which payloads (`named_hashes`),
    and drops the payloads none names, inside the caller's transaction. For files this
    service's writes did not keep: upstream's before 0.32 lack the references of pointers a
    message was written with (deleting the one message holding a reference dropped bytes
    another still named), its duplicate imports leave payloads nothing names, and references of
    messages gone or changed would keep payloads for good."""
    named: set[tuple[str, str, str]] = set()
    rows = conn.execute(
        "SELECT session_id, id, content, content_chunks FROM cf_agents_session_messages "
        "WHERE content_chunks > 0 OR instr(content, 'attachment:sha256:') > 0"
    )
    for session_id, message_id, content, chunks in rows:  # a row at a time: rows run to 1.5 MiB
        text = stored_json_of(conn, session_id, message_id, content, chunks)
        named.update((str(session_id), str(message_id), digest) for digest in named_hashes(text))
    held = {
        (str(s), str(m), str(h))
        for s, m, h in conn.execute("SELECT session_id, message_id, hash FROM cf_agents_session_attachment_refs")
    }
    conn.executemany(
        "DELETE FROM cf_agents_session_attachment_refs WHERE session_id = ? AND message_id = ? AND hash = ?",
        sorted(held - named),
    )
    conn.executemany(
        "INSERT INTO cf_agents_session_attachment_refs (session_id, message_id, hash) VALUES (?, ?, ?)",
        sorted(named - held),
    )
    unreferenced = conn.execute(
        "SELECT hash FROM cf_agents_session_attachment_meta AS meta WHERE NOT EXISTS "
        "(SELECT 1 FROM cf_agents_session_attachment_refs AS refs WHERE refs.hash = meta.hash)"
    ).fetchall()
    for (digest,) in unreferenced:
        conn.execute("DELETE FROM cf_agents_session_attachment_chunks WHERE hash = ?", (digest,))
        conn.execute("DELETE FROM cf_agents_session_attachment_meta WHERE hash = ?", (digest,))


def add_refs(conn: sqlite3.Connection, session_id: str, message_id: str, hashes: Iterable[str]) -> int:
    written = 0
    for digest in hashes:
        written += conn.execute(
            """INSERT OR IGNORE INTO cf_agents_session_attachment_refs (session_id, message_id, hash)
               VALUES (?, ?, ?)""",
            (session_id, message_id, digest),
        ).rowcount
    return written


def replace_refs(conn: sqlite3.Connection, session_id: str, message_id: str, hashes: Sequence[str]) -> int:
    """Points a message at exactly `hashes` (a diff), collecting what that orphaned."""
    held = {
        str(r[0])
        for r in conn.execute(
            "SELECT hash FROM cf_agents_session_attachment_refs WHERE session_id = ? AND message_id = ?",
            (session_id, message_id),
        )
    }
    wanted = set(hashes)
    dropped = [digest for digest in held if digest not in wanted]
    for digest in dropped:
        conn.execute(
            "DELETE FROM cf_agents_session_attachment_refs WHERE session_id = ? AND message_id = ? AND hash = ?",
            (session_id, message_id, digest),
        )
    written = len(dropped) + add_refs(conn, session_id, message_id, [h for h in hashes if h not in held])
    if dropped:
        written += collect_payloads(conn, dropped)
    return written


def load_payload(conn: sqlite3.Connection, digest: str) -> tuple[str, bytes] | None:
    """(media type, bytes) of a payload, or None when the address is unknown."""
    meta = conn.execute(
        "SELECT bytes, media_type, chunks FROM cf_agents_session_attachment_meta WHERE hash = ?", (digest,)
    ).fetchone()
    if meta is None:
        return None
    if not meta[2]:
        return str(meta[1]), b""
    data = b"".join(
        bytes(r[0])
        for r in conn.execute(
            "SELECT data FROM cf_agents_session_attachment_chunks WHERE hash = ? ORDER BY idx", (digest,)
        )
    )
    return str(meta[1]), data


def payload_meta(conn: sqlite3.Connection, digest: str) -> tuple[str, int, int] | None:
    """(media type, size in bytes, chunk count) of a payload, or None."""
    meta = conn.execute(
        "SELECT media_type, bytes, chunks FROM cf_agents_session_attachment_meta WHERE hash = ?", (digest,)
    ).fetchone()
    return None if meta is None else (str(meta[0]), int(meta[1]), int(meta[2]))


def payload_chunk(conn: sqlite3.Connection, digest: str, index: int) -> bytes | None:
    row = conn.execute(
        "SELECT data FROM cf_agents_session_attachment_chunks WHERE hash = ? AND idx = ?", (digest, index)
    ).fetchone()
    return None if row is None else bytes(row[0])


# ── search index ─────────────────────────────────────────────────────────────


def index_search_text(
    conn: sqlite3.Connection, session_id: str, message_id: str, role: str, text: str, *, replace: bool
) -> int:
    """Maintains a message's FTS row when the index exists; unchanged text writes nothing."""
    if not fts_exists(conn):
        return 0
    written = 0
    if replace:
        ensure_fts_lookup(conn)
        existing = conn.execute(
            "SELECT id, CAST(c3 AS BLOB) FROM cf_agents_session_fts_content WHERE c1 = ? AND c0 = ?",
            (session_id, message_id),
        ).fetchall()
        if existing:
            if len(existing) == 1 and existing[0][1] == text.encode("utf-8", "surrogatepass"):
                return 0
            conn.executemany(_DELETE_SEARCH_ROW_SQL, [(row[0],) for row in existing])
            written += 1
    if text:
        conn.execute(_INSERT_SEARCH_ROW_SQL, (message_id, session_id, role, _indexable(text)))
        written += 1
    return written


# ── compactions and session configuration ────────────────────────────────────


def next_compaction_seq(conn: sqlite3.Connection, session_id: str) -> int:
    """One above the session's highest record seq (`_session_compactions`: no summary is read)."""
    return max((int(row[0]) for row in _session_compactions(conn, session_id, "seq")), default=0) + 1


def insert_compaction(conn: sqlite3.Connection, session_id: str, record: Compaction) -> None:
    conn.execute(
        """INSERT INTO cf_agents_session_compactions
             (session_id, id, seq, summary, from_message_id, to_message_id, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?)""",
        (
            session_id,
            record.id,
            record.seq,
            record.summary,
            record.from_message_id,
            record.to_message_id,
            record.created_at_ms,
        ),
    )


def get_config(conn: sqlite3.Connection, session_id: str, key: str) -> str | None:
    row = conn.execute(
        "SELECT value FROM cf_agents_session_config WHERE session_id = ? AND key = ?", (session_id, key)
    ).fetchone()
    return None if row is None else str(row[0])


def set_config(conn: sqlite3.Connection, session_id: str, key: str, value: str) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO cf_agents_session_config (session_id, key, value) VALUES (?, ?, ?)",
        (session_id, key, value),
    )


# ── object statistics ────────────────────────────────────────────────────────


# The next session id after ?1 among sessions holding messages or compactions: two seeks.
_NEXT_SESSION = """(SELECT MIN(next) FROM (
    SELECT MIN(session_id) AS next FROM cf_agents_session_messages WHERE session_id > {after}
    UNION ALL
    SELECT MIN(session_id) FROM cf_agents_session_compactions WHERE session_id > {after}))"""
_FIRST_SESSION = """(SELECT MIN(first) FROM (
    SELECT MIN(session_id) AS first FROM cf_agents_session_messages
    UNION ALL
    SELECT MIN(session_id) FROM cf_agents_session_compactions))"""


def sessions_page(conn: sqlite3.Connection, after: str | None, limit: int) -> list[tuple[str, int]]:
    """(session id, message rows) of up to `limit` sessions holding messages or compactions, in
    id order after `after` (None: from the first). Steps from one session id to the next by
    index seeks and counts only the page's sessions' rows: a page costs its sessions, not the
    object (a page of 1,000 of 20,000 sessions read every row of the object before)."""
    start = _FIRST_SESSION if after is None else _NEXT_SESSION.format(after="?1")
    rows = conn.execute(
        f"""WITH RECURSIVE page(session_id, taken) AS (
              SELECT {start}, 1
              UNION ALL
              SELECT {_NEXT_SESSION.format(after="page.session_id")}, taken + 1
              FROM page WHERE page.session_id IS NOT NULL AND taken < ?2
            )
            SELECT session_id,
                   (SELECT COUNT(*) FROM cf_agents_session_messages AS m WHERE m.session_id = page.session_id)
            FROM page WHERE session_id IS NOT NULL""",
        (after, limit),
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


OBJECT_COUNTS = (
    "message_rows",
    "session_count",
    "continuation_rows",
    "attachment_count",
    "attachment_bytes",
    "free_bytes",
)


def object_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Row and payload counts of an object (OBJECT_COUNTS)."""
    messages, sessions = conn.execute(
        "SELECT COUNT(*), COUNT(DISTINCT session_id) FROM cf_agents_session_messages"
    ).fetchone()
    continuations = conn.execute("SELECT COUNT(*) FROM cf_agents_session_message_chunks").fetchone()[0]
    attachments, attachment_bytes = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM cf_agents_session_attachment_meta"
    ).fetchone()
    return {
        "message_rows": int(messages),
        "session_count": int(sessions),
        "continuation_rows": int(continuations),
        "attachment_count": int(attachments),
        "attachment_bytes": int(attachment_bytes),
        "free_bytes": database_bytes(conn) - bytes_in_use(conn),
    }


# ── full-text search ─────────────────────────────────────────────────────────

FTS_TOKENIZER = "porter unicode61"
FTS_DDL = f"""CREATE VIRTUAL TABLE cf_agents_session_fts
       USING fts5(id UNINDEXED, session_id UNINDEXED, role UNINDEXED, content, tokenize='{FTS_TOKENIZER}')"""
BACKFILL_PAGE_ROWS = 500


# Beyond upstream: FTS5 finds rows by `rowid` or by a full-text match, so upstream's maintenance
# (`DELETE ... WHERE id = ? AND session_id = ?`, and the read before an update) reads every row
# of the index: 1-6 s for one update or delete in an object of a million indexed messages,
# holding its write lock. An index on the FTS table's own content table (columns c0 = id,
# c1 = session_id) finds a message's index rows by key; SQLite keeps it up to date under any
# writer, upstream included, and the rows are then deleted through the FTS table by rowid.
FTS_LOOKUP_DDL = "CREATE INDEX IF NOT EXISTS _sessions_fts_by_message ON cf_agents_session_fts_content (c1, c0)"
_DELETE_SEARCH_ROW_SQL = "DELETE FROM cf_agents_session_fts WHERE rowid = ?"


_token_counters = threading.local()


def count_index_tokens(text: str) -> int:
    """The tokens the search index's tokenizer finds in `text`, each repeat counted: FTS5's own
    count, from an in-memory index of the calling thread's whose row is rolled back. (A count
    of our own by Unicode categories missed which marks FTS5 splits words at, and its Unicode
    tables differ from Python's: a query of 1,024 words passed for one.)"""
    conn: sqlite3.Connection | None = getattr(_token_counters, "conn", None)
    if conn is None:
        conn = sqlite3.connect(":memory:")
        conn.execute(f"CREATE VIRTUAL TABLE words USING fts5(text, tokenize='{FTS_TOKENIZER}')")
        conn.execute("CREATE VIRTUAL TABLE found USING fts5vocab(words, 'instance')")
        _token_counters.conn = conn
    try:
        conn.execute("INSERT INTO words (text) VALUES (?)", (text,))
        (count,) = conn.execute("SELECT count(*) FROM found").fetchone()
    finally:
        conn.rollback()
    return int(count)


def create_fts(conn: sqlite3.Connection) -> None:
    # Looked up again from here on: the creation may still roll back with its transaction.
    if isinstance(conn, ObjectConnection):
        conn.fts_absent = False
    conn.execute(FTS_DDL)


def ensure_fts_lookup(conn: sqlite3.Connection) -> None:
    """Creates the index rows are found by (once per writer connection, in the caller's write
    transaction, until a rollback: `forget_uncommitted`), for an index built before it existed
    or by upstream. The queries that use it are right without it, but a backfill without it
    reads the whole index for every message (48 s, not 0.4 s, for 40,000 messages)."""
    if getattr(conn, "fts_lookup_ensured", False):
        return
    conn.execute(FTS_LOOKUP_DDL)
    if isinstance(conn, ObjectConnection):
        conn.fts_lookup_ensured = True


def has_search_row(conn: sqlite3.Connection, session_id: str, message_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM cf_agents_session_fts_content WHERE c1 = ? AND c0 = ? LIMIT 1", (session_id, message_id)
    ).fetchone()
    return row is not None


# Where the first search's backfill of the index stands while it is under way (in `_sessions_meta`,
# so that a build a restart or a close cut short goes on from there): the (session id, message
# id) key of the last message it passed, as JSON, or "" before the first. No row: none under way.
_BACKFILL_KEY = "search_backfill_after"
# Recorded when a backfill of this service's finishes: from then on every message is indexed (each
# write indexes its own). An index without it was filled elsewhere (by upstream, or by this
# service before it kept the record).
_WHOLE_KEY = "search_index_whole"


@dataclass(frozen=True)
class Backfill:
    """A backfill of the search index under way: the key of the last message it passed."""

    after: tuple[str, str] | None


def backfill_under_way(conn: sqlite3.Connection) -> Backfill | None:
    row = conn.execute("SELECT value FROM _sessions_meta WHERE key = ?", (_BACKFILL_KEY,)).fetchone()
    if row is None:
        return None
    if not row[0]:
        return Backfill(None)
    session_id, message_id = json.loads(row[0])
    return Backfill((str(session_id), str(message_id)))


def record_backfill(conn: sqlite3.Connection, after: tuple[str, str] | None) -> None:
    value = "" if after is None else json.dumps(list(after))
    conn.execute("INSERT OR REPLACE INTO _sessions_meta (key, value) VALUES (?, ?)", (_BACKFILL_KEY, value))


def end_backfill(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM _sessions_meta WHERE key = ?", (_BACKFILL_KEY,))
    conn.execute("INSERT OR REPLACE INTO _sessions_meta (key, value) VALUES (?, '')", (_WHOLE_KEY,))


def search_index_problem(conn: sqlite3.Connection) -> str | None:
    """What FTS5's own check finds wrong with the search index (its words against the texts it
    holds), or None; None too without an index. SQLite's integrity check passes an index whose
    rows went missing, which the first search then finds damaged, refusing the object."""
    if not fts_exists(conn):
        return None
    try:
        conn.execute("INSERT INTO cf_agents_session_fts (cf_agents_session_fts) VALUES ('integrity-check')")
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None


def drop_search_index(conn: sqlite3.Connection) -> None:
    """Drops the search index and what is recorded of its filling: the object's first search
    builds it again from the messages, as for a file that never had one."""
    conn.execute("DROP TABLE cf_agents_session_fts")
    conn.execute("DELETE FROM _sessions_meta WHERE key IN (?, ?)", (_BACKFILL_KEY, _WHOLE_KEY))
    if isinstance(conn, ObjectConnection):
        conn.fts_known = False


def backfill_partial_index(conn: sqlite3.Connection) -> bool:
    """Records a backfill, from the first message, for a search index this service did not fill
    (upstream's skips messages with continuation rows, and nothing but a backfill would index
    them): the first search then indexes what is missing, passing over what is indexed. True
    if it recorded one."""
    if not fts_exists(conn) or backfill_under_way(conn) is not None:
        return False
    if conn.execute("SELECT 1 FROM _sessions_meta WHERE key = ?", (_WHOLE_KEY,)).fetchone() is not None:
        return False
    record_backfill(conn, None)
    return True


def _delete_search_rows(conn: sqlite3.Connection, rowids_sql: str, params: tuple[object, ...]) -> int:
    """Deletes the index rows whose rowids `rowids_sql` selects from the content table; how many."""
    ensure_fts_lookup(conn)
    rowids = conn.execute(rowids_sql, params).fetchall()
    conn.executemany(_DELETE_SEARCH_ROW_SQL, rowids)
    return len(rowids)


@dataclass(frozen=True, slots=True)
class BackfillRow:
    """A stored message as the index backfill pages through them: its key, whether SQL alone can
    index it (one slice, stamped: whole JSON as written), and its first slice's bytes."""

    key: tuple[str, str]
    plain: bool
    bytes: int


def backfill_page(conn: sqlite3.Connection, after: tuple[str, str] | None) -> list[BackfillRow]:
    """The next BACKFILL_PAGE_ROWS messages after the key `after`, in (session_id, id) order."""
    where = "" if after is None else "WHERE (session_id, id) > (?, ?)"
    return [
        BackfillRow((str(r[0]), str(r[1])), bool(r[2]), int(r[3]))
        for r in conn.execute(
            f"""SELECT session_id, id, content_chunks = 0 AND content_hash IS NOT NULL,
                       LENGTH(CAST(content AS BLOB))
                FROM cf_agents_session_messages {where} ORDER BY session_id, id LIMIT {BACKFILL_PAGE_ROWS}""",
            after or (),
        )
    ]


# SQLite before 3.45 (Debian 12 has 3.40) ends the SQL value of a JSON string at its first
# U+0000 (`->>`, json_extract), where upstream's keeps the whole string: a text part holding one
# was indexed cut short by the first search's build ("a\u0000x word": "a"), or not at all. Such
# a text (rare, and its JSON then holds the escape) is decoded by a function of ours instead.
JSON_TEXT_FUNCTION = "sessions_json_text"


def message_text_sql(content: str) -> str:
    """SQL for what the first search indexes of the message JSON `content`, as upstream's SQLite
    reads it: the `text` of its text parts, joined by spaces; NULL when none has text. Only a
    message whose JSON holds the escape goes through the function (a scan for it costs a tenth
    of reading the parts; checked per part, the build's reads took half as long again)."""

    def joined(text: str) -> str:
        return f"""(SELECT group_concat({text}, ' ') FROM json_each({content}, '$.parts') AS part
            WHERE part.value ->> '$.type' = 'text' AND coalesce({text}, '') <> '')"""

    whole = "part.value -> '$.text'"
    decoded = f"CASE WHEN instr({whole}, '\\u0000') THEN {JSON_TEXT_FUNCTION}({whole}) ELSE part.value ->> '$.text' END"
    plain = "part.value ->> '$.text'"
    return f"(CASE WHEN instr({content}, '\\u0000') THEN {joined(decoded)} ELSE {joined(plain)} END)"


def use_json_text_function(conn: sqlite3.Connection) -> None:
    """Makes `message_text_sql` work on `conn`: an object's connections have it from the start;
    another (import-store's, where the lift runs) gets it here."""
    if not isinstance(conn, ObjectConnection):
        conn.create_function(JSON_TEXT_FUNCTION, 1, _json_text, deterministic=True)


def _json_text(representation: str) -> str | bytes:
    """`->>`'s value of the JSON `representation`, whole: a string decoded, anything else (an
    object or array holding the escape) left as JSON text, as `->>` leaves it."""
    try:
        value = json.loads(representation)
    except ValueError:
        return representation
    return _indexable(value) if isinstance(value, str) else representation


# The first search's backfill indexes a stored message as SQLite's JSON functions read it, as
# upstream's does: non-string `text` values by SQLite's rules (true as 1, an object as its JSON),
# which differ from the write path's JavaScript string conversion. No row when no text part has
# non-empty text.
_BACKFILL_SEARCH_ROW_SQL = f"""INSERT INTO cf_agents_session_fts (id, session_id, role, content)
    SELECT ?1, ?2, ?3, text FROM (SELECT {message_text_sql("?4")} AS text) WHERE text IS NOT NULL"""


# The same for plain messages in a key range, in one statement: FTS5 costs about 100 us more per
# statement than per row (20,000 messages of 150 words: 3.2 s a statement each, 0.9 s in pages).
# Messages a write indexed since the index was created are passed over.
_BACKFILL_RANGE_SQL = f"""INSERT INTO cf_agents_session_fts (id, session_id, role, content)
    SELECT id, session_id, role, text FROM (
        SELECT m.id, m.session_id, m.role, {message_text_sql("m.content")} AS text
          FROM cf_agents_session_messages AS m
         WHERE {{after}} (m.session_id, m.id) <= (?3, ?4)
           AND NOT EXISTS (SELECT 1 FROM cf_agents_session_fts_content AS c WHERE c.c1 = m.session_id AND c.c0 = m.id)
         ORDER BY m.session_id, m.id)
     WHERE text IS NOT NULL"""


def backfill_range(conn: sqlite3.Connection, after: tuple[str, str] | None, through: tuple[str, str]) -> int:
    """Indexes the messages after the key `after` through `through` (all plain); rows written."""
    use_json_text_function(conn)
    sql = _BACKFILL_RANGE_SQL.format(after="" if after is None else "(m.session_id, m.id) > (?1, ?2) AND")
    return conn.execute(sql, (*(after or ("", "")), *through)).rowcount


def backfill_search_row(conn: sqlite3.Connection, session_id: str, message_id: str, role: str, content: str) -> bool:
    """Indexes one stored message (its whole JSON, continuation rows joined) for the backfill;
    True when it got a row."""
    use_json_text_function(conn)
    return conn.execute(_BACKFILL_SEARCH_ROW_SQL, (message_id, session_id, role, content)).rowcount > 0


def insert_search_row(conn: sqlite3.Connection, session_id: str, message_id: str, role: str, text: str) -> None:
    conn.execute(_INSERT_SEARCH_ROW_SQL, (message_id, session_id, role, _indexable(text)))


MessageVersion = tuple[int, str | None]
"""A message row's (seq, content digest): changed by its update, or its deletion and a new row
under its id."""


def search(
    conn: sqlite3.Connection, session_id: str | None, expression: str, limit: int
) -> list[tuple[int, str, str, str, MessageVersion]]:
    """(index rowid, id, role, session_id, the message's version) best match first; hidden
    overlay rows excluded. The texts are read afterwards (`search_texts`), a bounded window at a
    time: a thousand hits of 20 MB messages are 20 GB. The caller bounds its time
    (`ObjectStore.read`'s deadline): an interrupted search raises SQLite's error."""
    hidden = _HIDDEN_SQL.format(id="f.id", session="f.session_id")
    session_filter = "" if session_id is None else "AND f.session_id = ?"
    params: tuple[object, ...] = (expression,) + (() if session_id is None else (session_id,)) + (limit,)
    try:
        return [
            (int(r[0]), str(r[1]), str(r[2]), str(r[3]), (int(r[4]), r[5]))
            for r in conn.execute(
                f"""SELECT f.rowid, f.id, f.role, f.session_id, m.seq, m.content_hash
                    FROM cf_agents_session_fts AS f
                    JOIN cf_agents_session_messages AS m ON m.session_id = f.session_id AND m.id = f.id
                    WHERE cf_agents_session_fts MATCH ? {session_filter} AND NOT {hidden}
                    ORDER BY rank LIMIT ?""",
                params,
            )
        ]
    except sqlite3.OperationalError as exc:
        if str(exc).startswith("fts5:"):
            raise QueryRejected(str(exc)) from None  # the expression: the caller's query
        raise  # stopped, or the storage's (I/O, a full disk, corruption): for the caller to tell


def search_texts(
    conn: sqlite3.Connection,
    hits: Sequence[tuple[int, str, str, MessageVersion]],
    max_bytes: int,
    expression: str,
) -> tuple[int, dict[int, str]]:
    """The indexed texts of search hits, given as (index rowid, id, session_id, the message's
    version as ranked), in that order, until they pass `max_bytes` (one at least): (how many
    hits were taken, their texts by rowid). A hit whose message changed since the search (its
    index row written anew) has its new text while that still matches `expression`; one deleted
    since, or changed not to match, has none. The index row at the ranked rowid is the ranked
    one only while the message is the version ranked: a message whose row was the index's last
    gets the same rowid when its row is written anew (FTS5 numbers a new row after the largest)."""
    texts: dict[int, str] = {}
    total = 0
    for taken, (rowid, message_id, session_id, version) in enumerate(hits, start=1):
        row = conn.execute(
            "SELECT id, session_id, CAST(content AS BLOB) FROM cf_agents_session_fts WHERE rowid = ?", (rowid,)
        ).fetchone()
        ranked = (
            row is not None
            and (row[0], row[1]) == (message_id, session_id)
            and _message_version(conn, session_id, message_id) == version
        )
        text = row[2] if ranked else None
        if text is None:
            text = _matching_text_now(conn, session_id, message_id, expression)
        if text is not None:
            texts[rowid] = _indexed_text(text)
            total += len(text)
            if total >= max_bytes:
                return taken, texts
    return len(hits), texts


def _message_version(conn: sqlite3.Connection, session_id: str, message_id: str) -> MessageVersion | None:
    row = conn.execute(
        "SELECT seq, content_hash FROM cf_agents_session_messages WHERE session_id = ? AND id = ?",
        (session_id, message_id),
    ).fetchone()
    return None if row is None else (int(row[0]), row[1])


def _matching_text_now(conn: sqlite3.Connection, session_id: str, message_id: str, expression: str) -> bytes | None:
    """A message's indexed text as it is now, if it still matches `expression`: its index row
    was written anew since the search ranked it (an update, an upsert of a streamed reply)."""
    for (rowid,) in conn.execute(
        "SELECT id FROM cf_agents_session_fts_content WHERE c1 = ? AND c0 = ?", (session_id, message_id)
    ).fetchall():
        row = conn.execute(
            "SELECT CAST(content AS BLOB) FROM cf_agents_session_fts WHERE cf_agents_session_fts MATCH ? AND rowid = ?",
            (expression, rowid),
        ).fetchone()
        if row is not None:
            return bytes(row[0] or b"")
    return None


def database_bytes(conn: Connection) -> int:
    """The database's size as the reader's snapshot has it, its WAL's pages included: what a
    copy of it (the backup API) writes. The -wal file itself keeps its largest size until the
    object closes, so the files' sizes can count twice as much."""
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    return int(pages) * int(page_size)


def bytes_in_use(conn: Connection) -> int:
    """The database's pages that hold data, in bytes: its size less its free pages. A delete or
    a clear frees pages that later writes reuse, while the file keeps its size."""
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    (free,) = conn.execute("PRAGMA freelist_count").fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    return (int(pages) - int(free)) * int(page_size)
