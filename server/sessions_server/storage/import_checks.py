"""Checks of a file brought in from elsewhere (ImportObject, `import-store`) that a file this
service wrote always passes: its schema runs nothing the service did not write, and its
attachments are what their rows say.

A store's schema is code: SQLite runs a trigger inside every write to its table, a view's query
wherever the view is read, a generated column's expression and an index's expression or WHERE
clause on every row written, and a column's DEFAULT expression on every insert that leaves it
out. A file that carried any of them into the service would have it run on the server's write
threads, with no deadline, on behalf of whoever sent it. So the file may hold other tables (an
agent's whole Durable Object database holds many), but no trigger, view or generated column at
all, and the service's own tables only as the service (or upstream) defines them.

Reads put attachment payloads back into messages by hash, and size their work by the payload
sizes the file records; both are trusted on every later read, so both are checked here.

A file that records a format of this service's files newer than this server knows (a newer
server's, `schema.FILE_FORMAT`) is refused too: this server would misread it, and installed it
would only be refused on every call, with the object it replaced gone."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence

from sessions_server.storage import queries, schema
from sessions_server.storage.rows import NewerFileFormat, shortened

_POINTER_PREFIX = "attachment:sha256:"
_HASH = re.compile(r"[0-9a-f]{64}\Z")
_CHECK_CONSTRAINT = re.compile(r"\bcheck\s*\(", re.IGNORECASE)
_COLLATE = re.compile(r"\bcollate\b", re.IGNORECASE)
NAME_CHARS = 64  # of a name from the file quoted in an error


class UnsafeFile(Exception):
    """The file holds schema the service would run and did not write, or attachments whose
    rows disagree with their hash. The message says what the file holds ("holds ...")."""


def check_schema(conn: sqlite3.Connection) -> None:
    """Raises UnsafeFile unless the file's schema is one this service would run as it is, and
    its format one this server knows (`check_format`). Reads the schema, and then the format
    record from `_sessions_meta` as this service defines it: nothing of the file runs."""
    reference = _reference_schema()
    for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall():
        kind, name, table = str(kind), str(name), str(table)
        if kind in ("trigger", "view"):
            raise UnsafeFile(f"holds a {kind} ({_quoted(name)}); a store holds none")
        known = reference.get(name)
        if kind == "table":
            virtual = _is_virtual(sql)
            if known is not None and virtual != _is_virtual(known.sql):
                raise UnsafeFile(f"holds a table {_quoted(name)} not of the kind this service defines")
            if virtual:
                if known is not None and _normalized(sql) != _normalized(known.sql):
                    raise UnsafeFile(f"holds a table {_quoted(name)} that is not the search index this service defines")
            else:
                _check_table(conn, name, str(sql or ""), known)
        elif (
            kind == "index"
            and table in reference
            and sql is not None  # None: a key's own index
            and (known is None or _normalized(sql) != _normalized(known.sql))
        ):
            raise UnsafeFile(f"holds an index {_quoted(name)} on {_quoted(table)} this service does not define")
    check_format(conn)  # after the loop: `_sessions_meta`, if there, is the service's table


def check_format(conn: sqlite3.Connection) -> None:
    """Raises UnsafeFile when the file records a format of this service's files newer than this
    server's. Run on a file whose `_sessions_meta`, if it has one, is as the service defines it
    (`check_schema`)."""
    try:
        schema.read_file_format(conn)
    except NewerFileFormat as exc:
        raise UnsafeFile(
            f"holds format {shortened(exc.recorded, 32)} of this service's files, newer than the {exc.known} this "
            "server knows: bring it into a server at least as new as the one that wrote it"
        ) from None


def integrity_problems(conn: sqlite3.Connection) -> list[str]:
    """SQLite's integrity check of each of the service's own tables with its indexes; empty when
    all is well. Other tables are left alone: the check would run their constraints' and
    indexes' expressions, which the service never does (the legacy lift only reads rows, and a
    damaged one fails it). Run after `check_schema`."""
    reference = _reference_schema()
    problems = []
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        if name in reference and not _is_virtual(reference[name].sql):
            problems += [str(row[0]) for row in conn.execute(f"PRAGMA integrity_check({_ident(name)})")]
    return [problem for problem in problems if problem != "ok"]


def check_attachments(conn: sqlite3.Connection) -> None:
    """Raises UnsafeFile for the first attachment whose chunks do not make up the
    bytes its hash and size name. Reads every payload once."""
    metas = conn.execute("SELECT hash, bytes, chunks FROM cf_agents_session_attachment_meta").fetchall()
    for digest_text, size, chunks in metas:
        digest = str(digest_text)
        if not _HASH.match(digest):
            raise UnsafeFile(f"holds an attachment whose hash {_quoted(digest)} is not a SHA-256 in hex")
        hasher = hashlib.sha256()
        total = 0
        count = 0
        for index, data in _chunks(conn, digest):
            if index != count:
                raise UnsafeFile(f"holds the attachment {digest} without its chunk {count}")
            hasher.update(data)
            total += len(data)
            count += 1
        if count != chunks or total != size:
            raise UnsafeFile(
                f"holds the attachment {digest} recorded as {size} bytes in {chunks} chunks; "
                f"its chunks hold {total} in {count}"
            )
        if hasher.hexdigest() != digest:
            raise UnsafeFile(f"holds the attachment {digest} with bytes of another hash")


def first_read_back_past(
    conn: sqlite3.Connection, limit: int, pointers: Callable[[str], Sequence[str]]
) -> tuple[str, str, int] | None:
    """(session id, message id, size) of the first message that names stored attachments and
    would read back, each put back inline (base64) at every place a read restores it
    (`pointers` of its stored JSON), past `limit` bytes (0: no limit), as writes refuse such a
    message. A message whose stored JSON alone passes the limit and holds a pointer's text is
    refused unread: a read that restores attachments builds the whole message."""
    if not limit:
        return None
    sizes = {str(h): int(b) for h, b in conn.execute("SELECT hash, bytes FROM cf_agents_session_attachment_meta")}
    if not sizes:
        return None
    rows = conn.execute("SELECT session_id, id, content, content_chunks FROM cf_agents_session_messages")
    for session_id, message_id, content, chunks in rows:  # a row at a time: rows run to 1.5 MiB
        key = (str(session_id), str(message_id))
        stored, named = _scan(_message_rows(conn, *key, str(content), int(chunks or 0)))
        if not named:
            continue
        if stored > limit:
            return (*key, stored)
        text = "".join(_message_rows(conn, *key, str(content), int(chunks or 0)))
        total = stored + sum((sizes.get(digest, 0) + 2) // 3 * 4 for digest in pointers(text))
        if total > limit:
            return (*key, total)
    return None


def _scan(pieces: Iterable[str]) -> tuple[int, bool]:
    """The UTF-8 bytes of a message's rows, and whether a pointer's text is in them (also across
    two rows: JSON is cut into rows anywhere)."""
    stored = 0
    named = False
    carried = ""
    for piece in pieces:
        stored += len(piece.encode("utf-8", "surrogatepass"))
        if not named:
            named = _POINTER_PREFIX in carried + piece[: len(_POINTER_PREFIX)] or _POINTER_PREFIX in piece
            carried = piece[-(len(_POINTER_PREFIX) - 1) :]
    return stored, named


def _message_rows(conn: sqlite3.Connection, session_id: str, message_id: str, head: str, chunks: int) -> Iterator[str]:
    yield head
    if chunks:
        for (piece,) in conn.execute(
            "SELECT content FROM cf_agents_session_message_chunks WHERE session_id = ? AND id = ? ORDER BY idx",
            (session_id, message_id),
        ):
            yield str(piece)


def _chunks(conn: sqlite3.Connection, digest: str) -> Iterator[tuple[int, bytes]]:
    for index, data in conn.execute(
        "SELECT idx, data FROM cf_agents_session_attachment_chunks WHERE hash = ? ORDER BY idx", (digest,)
    ):
        yield int(index), bytes(data)


class _Defined:
    """A table or index as this service creates it: its SQL and, for a table, each column's
    (declared type, not null, key position, default) by name and its keys (`_keys`)."""

    def __init__(self, sql: str, columns: dict[str, tuple[str, int, int, str | None]], keys: frozenset[str]) -> None:
        self.sql = sql
        self.columns = columns
        self.keys = keys


@functools.cache
def _reference_schema() -> dict[str, _Defined]:
    """The service's tables and indexes, search index included, as SQLite records them."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for ddl in (*schema.TABLES_DDL, queries.FTS_DDL, queries.FTS_LOOKUP_DDL):
            conn.execute(ddl)
        defined = {}
        for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall():
            if sql is None:
                continue
            columns: dict[str, tuple[str, int, int, str | None]] = {}
            keys: frozenset[str] = frozenset()
            if kind == "table" and not _is_virtual(sql):
                columns = {column[0]: column[1:] for column in _columns(conn, name)}
                keys = _keys(conn, name)
            defined[str(name)] = _Defined(str(sql), columns, keys)
        return defined


def _check_table(conn: sqlite3.Connection, name: str, sql: str, known: _Defined | None) -> None:
    """No generated column in any table; the service's own tables with no column it does not
    define or defines otherwise (type, NOT NULL, key, DEFAULT: SQLite runs a default on every
    insert that leaves its column out), no key or collation of their own, and no CHECK."""
    if any(int(row[6]) in (2, 3) for row in conn.execute(f"PRAGMA table_xinfo({_ident(name)})")):
        raise UnsafeFile(f"holds a table {_quoted(name)} with a generated column; a store has none")  # hidden 2, 3
    if known is None:
        return  # not the service's: nothing of the service reads or writes it
    for column, kind, notnull, pk, default in _columns(conn, name):
        expected = known.columns.get(column)
        if expected is None:
            raise UnsafeFile(
                f"holds a table {_quoted(name)} with a column {_quoted(column)} this service does not define"
            )
        if default is not None and default != expected[3]:
            raise UnsafeFile(
                f"holds a table {_quoted(name)} that gives {_quoted(column)} a default this service does not"
            )
        if (kind, notnull, pk) != expected[:3]:
            raise UnsafeFile(
                f"holds a table {_quoted(name)} whose column {_quoted(column)} is not declared as this service does"
            )
    if _keys(conn, name) != known.keys:
        raise UnsafeFile(f"holds a table {_quoted(name)} with keys this service does not define")
    if _CHECK_CONSTRAINT.search(sql):
        raise UnsafeFile(f"holds a table {_quoted(name)} with a CHECK constraint this service does not define")
    if _COLLATE.search(sql):
        raise UnsafeFile(f"holds a table {_quoted(name)} with a collation this service does not define")


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str, int, int, str | None]]:
    """(name, declared type, not null, key position, default) of each column."""
    return [
        (str(row[1]), str(row[2]).upper(), int(row[3]), int(row[5]), row[4])
        for row in conn.execute(f"PRAGMA table_xinfo({_ident(table)})")
    ]


def _keys(conn: sqlite3.Connection, table: str) -> frozenset[str]:
    """The table's primary key and UNIQUE constraints, each as its kind, uniqueness and columns
    with their order and collation (`CREATE INDEX`es are compared by their SQL)."""
    keys = set()
    for _, index, unique, origin, partial in conn.execute(f"PRAGMA index_list({_ident(table)})").fetchall():
        if origin == "c":
            continue
        columns = [
            f"{row[2]} {row[3]} {row[4]}"  # name, descending, collation
            for row in conn.execute(f"PRAGMA index_xinfo({_ident(index)})")
            if row[5]  # key columns only
        ]
        keys.add(f"{origin} {unique} {partial}: {', '.join(columns)}")
    return frozenset(keys)


def _is_virtual(sql: object) -> bool:
    return str(sql or "").upper().startswith("CREATE VIRTUAL TABLE")


def _normalized(sql: object) -> str:
    text = re.sub(r"\s+", " ", str(sql or "")).strip().lower()
    return text.replace(" if not exists ", " ")


def _ident(name: object) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def _quoted(text: str) -> str:
    return repr(shortened(text, NAME_CHARS))
