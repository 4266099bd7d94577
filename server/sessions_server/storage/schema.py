"""Upstream's schema (reference notes §1), created on open, plus the schema version and lift.

The file format is upstream's so that a store moves between upstream and this service as a file
copy: the same tables, columns, encodings and `_cf_KV` version record. The additions, which
upstream never reads and SQLite keeps up to date under any writer: `_sessions_meta`, which
records the object key a file belongs to and the format of this service's files it is in
(`FILE_FORMAT`), and four indexes (`_sessions_messages_by_seq`,
`_sessions_messages_by_parent`, `_sessions_attachment_refs_by_hash`, and `_sessions_fts_by_message`
on the search index's content table, see `queries.FTS_LOOKUP_DDL`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from sessions_server.storage.queries import (
    FTS_LOOKUP_DDL,
    message_text_sql,
    reconcile_attachment_refs,
    use_json_text_function,
)
from sessions_server.storage.rows import NewerFileFormat, ObjectDamaged, shortened

# New files get 16 KiB pages: at 4 KiB, upstream's ~1 KB WITHOUT ROWID rows spill to overflow
# pages (4.7 KB on disk per message, 2-3x slower scans). Page size is not part of the format.
NEW_FILE_PAGE_SIZE = 16384

SCHEMA_VERSION_KEY = "cf_agents:sessions_schema_version"
# The version as workerd stores KV values: V8 serialization (header 0xFF 0x0F, tag 'I' for a
# zig-zag varint int32). 1 encodes as 0x02.
SCHEMA_VERSION_1 = b"\xff\x0f\x49\x02"

# The format of this service's own files, recorded in `_sessions_meta` under FILE_FORMAT_KEY.
# Upstream's version above says what upstream's code may assume of the tables, and it stays 1
# (upstream reads the file too); this one says what this service's code assumes beyond that. It
# did not exist when attachments came to be stored by hash, so servers from before that serve
# the stored `attachment:sha256:` pointers as the messages' media, without a word. Raise it with
# any change that the servers of the format before would misread, and make the change in the
# upgrade transaction of `initialize`, which records it: every server from format 1 on refuses a
# file of a format newer than its own (NewerFileFormat) instead of misreading it, so a rollback
# is refused, not silently wrong. A file without the record (upstream's, or a server's from
# before formats were recorded) is read as format 1 is, and gains the record on its first open.
FILE_FORMAT = 1
FILE_FORMAT_KEY = "format"
# The longest format record read as a number: longer ones are no format any server wrote.
_FORMAT_DIGITS = 9

MESSAGES_DDL = """CREATE TABLE IF NOT EXISTS cf_agents_session_messages (
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
        content_hash TEXT,
        PRIMARY KEY (session_id, id)
      ) WITHOUT ROWID"""

TABLES_DDL = (
    MESSAGES_DDL,
    """CREATE TABLE IF NOT EXISTS cf_agents_session_message_chunks (
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        content TEXT NOT NULL,
        PRIMARY KEY (session_id, id, idx)
      ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS cf_agents_session_compactions (
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        summary TEXT NOT NULL,
        from_message_id TEXT NOT NULL,
        to_message_id TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, id)
      ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS cf_agents_session_config (
        session_id TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (session_id, key)
      ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS cf_agents_session_attachment_meta (
        hash TEXT PRIMARY KEY,
        bytes INTEGER NOT NULL,
        media_type TEXT NOT NULL,
        chunks INTEGER NOT NULL
      ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS cf_agents_session_attachment_chunks (
        hash TEXT NOT NULL,
        idx INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (hash, idx)
      ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS cf_agents_session_attachment_refs (
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (session_id, message_id, hash)
      ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS _cf_KV (
        key TEXT PRIMARY KEY,
        value BLOB
      ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS _sessions_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
      ) WITHOUT ROWID""",
    # Beyond upstream: finding a session's newest row (the active leaf) is otherwise a scan and
    # sort of the whole session on every cold open. Upstream's own query uses it transparently,
    # and its code never depends on the absence of indexes.
    """CREATE INDEX IF NOT EXISTS _sessions_messages_by_seq ON cf_agents_session_messages (session_id, seq)""",
    # Beyond upstream too (upstream has no secondary index): a row's direct children. Without it
    # `queries.children` (GetBranches) and `queries.delete_messages`' re-parenting of a deleted
    # row's children read every row of the session (~37 ms at 100,000 messages; the delete holds
    # the object's write lock meanwhile). `seq` makes it covering (the key's `id` rides along)
    # and ordered for `children`; with (session_id, parent_id) alone SQLite still chose the scan.
    # A file without it (upstream's, an older server's) is not ready and gains it on open.
    """CREATE INDEX IF NOT EXISTS _sessions_messages_by_parent
        ON cf_agents_session_messages (session_id, parent_id, seq)""",
    # Beyond upstream as well: the messages that name an attachment. A payload that arrives after
    # messages named it (a pointer copied from another object) makes them read back larger, and
    # they are found here and measured again; a payload whose last reference went is found
    # unreferenced here. Without it, both read every reference in the object.
    """CREATE INDEX IF NOT EXISTS _sessions_attachment_refs_by_hash ON cf_agents_session_attachment_refs (hash)""",
)
REFS_BY_HASH_INDEX = "_sessions_attachment_refs_by_hash"
EXPECTED_OBJECTS = frozenset(
    {
        "cf_agents_session_messages",
        "cf_agents_session_message_chunks",
        "cf_agents_session_compactions",
        "cf_agents_session_config",
        "cf_agents_session_attachment_meta",
        "cf_agents_session_attachment_chunks",
        "cf_agents_session_attachment_refs",
        "_cf_KV",
        "_sessions_meta",
        "_sessions_messages_by_seq",
        "_sessions_messages_by_parent",
        "_sessions_attachment_refs_by_hash",
    }
)


class ObjectKeyConflict(Exception):
    """The file at an object's path records a different object key: it was copied or restored
    there by hand. Serving it would mix two objects, so calls on either key leave it alone."""

    def __init__(self, recorded_key: str, object_key: str) -> None:
        super().__init__(f"file belongs to object key {recorded_key!r}, not {object_key!r}")
        self.recorded_key = recorded_key
        self.object_key = object_key


BUSY_TIMEOUT_MS = 10_000  # how long a statement waits for another connection's lock
WAL_SIZE_LIMIT_BYTES = 32 * 1024 * 1024
"""The size a WAL file is cut back to once checkpointed: twice what a checkpoint is due at (1,000
frames of 16 KiB), so that steady writes never pay for cutting and regrowing it."""


def configure_connection(
    conn: sqlite3.Connection, busy_timeout_ms: int = BUSY_TIMEOUT_MS, *, writes: bool = True
) -> None:
    """Settings every connection to an object file needs: WAL, full durability, no FK surprises.
    `writes`: the connection runs write jobs (a reader's does not). One script: each statement
    run alone is a call into SQLite and back, and every open runs these."""
    conn.executescript(_connection_settings(busy_timeout_ms, writes=writes))


def _connection_settings(busy_timeout_ms: int, *, writes: bool) -> str:
    settings = [
        f"PRAGMA busy_timeout = {int(busy_timeout_ms)}",
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = FULL",
    ]
    if writes:
        settings += [
            # Every write job runs in a savepoint; with file-backed temp storage SQLite would
            # open (and unlink) a statement journal in the temp directory every few commits.
            # Readers keep the default: after a query that sorted many rows in memory (a search
            # for a common word), the connection's next statement spent 5-20 ms releasing that
            # memory.
            "PRAGMA temp_store = MEMORY",
            # SQLite builds differ here (Debian's, the Docker image's base, zeroes every freed
            # page): zeroing each page a delete frees sends it through the WAL as well, so
            # clearing a 60 MB session needed 60 MB more of free disk, and failed STORAGE_FULL on
            # a full one. FAST zeroes what the delete rewrites anyway; freed pages keep their
            # bytes until reused.
            "PRAGMA secure_delete = FAST",
            # A checkpoint leaves the WAL file at its largest size; after a large transaction
            # the next commit after a checkpoint cuts it back to this (the sweep empties a quiet
            # one).
            f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}",
        ]
    return ";\n".join(settings) + ";"


def is_ready(conn: sqlite3.Connection, object_key: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> bool:
    """Whether the file is an object this service opened before: nothing to create, lift or
    check (then the connection is configured). Writes nothing: a file not in WAL mode (one
    copied in, say) is not ready, as switching it to WAL writes. Raises ObjectKeyConflict or
    NewerFileFormat for a file no open may serve (`_is_current`)."""
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    if not names >= EXPECTED_OBJECTS or conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        return False
    configure_connection(conn, busy_timeout_ms)
    return _is_current(conn, object_key)


# Names (prefixes) of what a file this service, upstream, or an older upstream (the legacy
# `assistant_*` tables) wrote holds: a file with none of them is another program's database.
OWN_NAME_PREFIXES = ("_sessions_", "cf_agents_", "cf_ai_", "_cf_", "assistant_")


def is_foreign(names: set[str]) -> bool:
    """Whether a file whose schema holds `names` is another program's SQLite database: it holds
    something (SQLite's own `sqlite_*` tables aside), none of it this service's or upstream's.
    An empty file (0 bytes, or a database with no schema yet) is a new object's."""
    theirs = {name for name in names if not name.startswith("sqlite_")}
    return bool(theirs) and not any(name.startswith(OWN_NAME_PREFIXES) for name in theirs)


def initialize(conn: sqlite3.Connection, object_key: str) -> None:
    """Creates or upgrades the schema, checks the recorded key and format, and runs the legacy
    lift. Raises, having changed nothing: ObjectDamaged for another program's database
    (`is_foreign`), which serving would take over by writing this service's tables into it;
    ObjectKeyConflict for another object's file; NewerFileFormat for a newer server's."""
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    if is_foreign(names):  # before anything writes (switching to WAL writes the file's header)
        shown = ", ".join(shortened(name, 64) for name in sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
        raise ObjectDamaged(
            f"not a Sessions object file: its schema holds neither this service's tables nor upstream's ({shown})",
            operation="open",
            foreign=True,
        )
    if not names:
        _create(conn, object_key)
        return
    if "_sessions_meta" in names:
        # Before anything writes (switching to WAL writes the header): another object's file, or
        # a newer server's, is left exactly as it is.
        _check_recorded(conn, object_key, record=False)
    configure_connection(conn)
    if names >= EXPECTED_OBJECTS and _is_current(conn, object_key):
        return  # an object this service opened before: nothing to create, lift or check
    conn.execute("BEGIN IMMEDIATE")
    with _rolled_back_on_failure(conn):
        for ddl in TABLES_DDL:
            conn.execute(ddl)
        _add_content_hash_column(conn)
        _check_recorded(conn, object_key)
        if read_schema_version(conn) < 1:
            complete = lift_legacy_tables(conn)
            if complete:
                conn.execute(
                    "INSERT OR REPLACE INTO _cf_KV (key, value) VALUES (?, ?)",
                    (SCHEMA_VERSION_KEY, SCHEMA_VERSION_1),
                )
        if names and REFS_BY_HASH_INDEX not in names:
            # Upstream's file, or one an older server kept (and imported from upstream): its
            # references may be short of what its messages name, or name what is gone.
            reconcile_attachment_refs(conn)
        conn.execute("COMMIT")


@contextlib.contextmanager
def _rolled_back_on_failure(conn: sqlite3.Connection) -> Iterator[None]:
    """Rolls the connection's transaction back when the block raises, and lets it raise."""
    try:
        yield
    except BaseException:
        # A failed COMMIT (a full disk) may have ended the transaction already: a bare ROLLBACK
        # then raised "no transaction is active" in place of the failure.
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        raise


# A new file's page size comes before WAL mode creates it; then the connection's settings and
# the schema, in one script.
_NEW_FILE_SCRIPT = (
    f"PRAGMA page_size = {NEW_FILE_PAGE_SIZE};\n"
    + _connection_settings(BUSY_TIMEOUT_MS, writes=True)
    + "\nBEGIN IMMEDIATE;\n"
    + ";\n".join(TABLES_DDL)
    + ";"
)
# A file `new_file_image` made has its page size and schema already.
_RECORD_SCRIPT = _connection_settings(BUSY_TIMEOUT_MS, writes=True) + "\nBEGIN IMMEDIATE;"


def _create(conn: sqlite3.Connection, object_key: str) -> None:
    """An empty file made a new object's: what the rest of `initialize` does for one, in four
    calls into SQLite where that made about thirty (each also releases the interpreter's lock and
    takes it again). On tmpfs, making a new object's file took 3.1 ms of CPU that way, 2.7 ms
    this way; 5.1 and 4.1 ms with eight threads making them at once."""
    with _rolled_back_on_failure(conn):
        conn.executescript(_NEW_FILE_SCRIPT)
        _record_new(conn, object_key)


def record_new_object(conn: sqlite3.Connection, object_key: str) -> None:
    """Makes a file written from `new_file_image` the object's: records its key, this server's
    format and upstream's schema version, as `_create` does in a file it made. Until this
    commits the file records no key, and the next open's `initialize` records one."""
    with _rolled_back_on_failure(conn):
        conn.executescript(_RECORD_SCRIPT)
        _record_new(conn, object_key)


def _record_new(conn: sqlite3.Connection, object_key: str) -> None:
    conn.execute(
        "INSERT INTO _sessions_meta (key, value) VALUES ('object_key', ?), (?, ?)",
        (object_key, FILE_FORMAT_KEY, str(FILE_FORMAT)),
    )
    conn.execute("INSERT INTO _cf_KV (key, value) VALUES (?, ?)", (SCHEMA_VERSION_KEY, SCHEMA_VERSION_1))
    conn.execute("COMMIT")


_image: bytes | None = None
_image_lock = threading.Lock()


def new_file_image(workdir: Path) -> bytes:
    """The bytes of a new object's file with nothing recorded in it yet: its schema in 16 KiB
    pages, in WAL mode, as `_create` leaves a file but for the records. Written as a new
    object's file, they spare each new object the DDL: on tmpfs a new file then cost 1.3-1.5 ms
    of CPU where `_create`'s cost 3.1-3.6 (`record_new_object` included, one thread), and on
    ext4 it took 13-20 ms where that took 25-30 (an fsync of the whole file where the DDL's
    pages went through the WAL and then into the file). Made once a process, by SQLite, in a
    file of its own in `workdir`, removed after."""
    global _image
    with _image_lock:
        if _image is None:
            built = workdir / f"new-file-image-{os.getpid()}.sqlite"
            _remove_with_wal(built)  # what a crash left of a build
            conn = sqlite3.connect(built, isolation_level=None)
            try:
                conn.executescript(_NEW_FILE_SCRIPT + "\nCOMMIT;")
                # Every page into the file itself, with the WAL emptied, before it is read.
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy:
                    raise sqlite3.OperationalError(f"{built} could not be checkpointed")
                conn.close()
                _image = built.read_bytes()
            finally:
                conn.close()
                _remove_with_wal(built)
        return _image


def _remove_with_wal(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")


# What the file records (`_recorded`): one row of two lookups by key (`key IN (...)`, or two
# statements, cost 3-4 µs more a run).
_RECORDED_SQL = (
    "SELECT (SELECT value FROM _sessions_meta WHERE key = 'object_key'),"
    f" (SELECT value FROM _sessions_meta WHERE key = '{FILE_FORMAT_KEY}')"
)
# What `_is_current` reads of a file holding every table (EXPECTED_OBJECTS), in one statement:
# every open of a current file runs it on a new connection, where compiling a statement costs
# more than running it. The key's and upstream's version's reads were two statements before the
# format was recorded; three subqueries in one cost about as much as those two.
_CURRENT_SQL = f"{_RECORDED_SQL}, (SELECT value FROM _cf_KV WHERE key = '{SCHEMA_VERSION_KEY}')"


def _is_current(conn: sqlite3.Connection, object_key: str) -> bool:
    """Schema version 1, the digest column present, and the file recorded as this object's, in
    this server's format. Raises ObjectKeyConflict or NewerFileFormat, as `_check_recorded`."""
    recorded_key, recorded_format, version = conn.execute(_CURRENT_SQL).fetchone()
    if recorded_key is not None and recorded_key != object_key:
        raise ObjectKeyConflict(str(recorded_key), object_key)
    if recorded_key is None or file_format(recorded_format) < FILE_FORMAT:
        return False
    if not isinstance(version, bytes) or decode_v8_small_int(version) < 1:  # as `read_schema_version`
        return False
    columns = {r[1] for r in conn.execute("PRAGMA table_info('cf_agents_session_messages')")}
    return "content_hash" in columns


def _add_content_hash_column(conn: sqlite3.Connection) -> None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info('cf_agents_session_messages')")}
    if "content_hash" not in columns:
        conn.execute("ALTER TABLE cf_agents_session_messages ADD COLUMN content_hash TEXT")


def _check_recorded(conn: sqlite3.Connection, object_key: str, *, record: bool = True) -> None:
    """Raises ObjectKeyConflict when the file records another key, NewerFileFormat when it
    records a format this server does not know. With `record`, records `object_key` where it
    records none, and this server's format where it records an older one or none (the caller's
    upgrade transaction makes the file that format)."""
    recorded_key, recorded_format = _recorded(conn)
    if recorded_key is not None and recorded_key != object_key:
        raise ObjectKeyConflict(str(recorded_key), object_key)
    older = file_format(recorded_format) < FILE_FORMAT
    if record and recorded_key is None:
        conn.execute("INSERT INTO _sessions_meta (key, value) VALUES ('object_key', ?)", (object_key,))
    if record and older:
        conn.execute(
            "INSERT OR REPLACE INTO _sessions_meta (key, value) VALUES (?, ?)", (FILE_FORMAT_KEY, str(FILE_FORMAT))
        )


def _recorded(conn: sqlite3.Connection) -> tuple[object, object]:
    """The object key and the format the file records (None for what it does not record)."""
    recorded_key, recorded_format = conn.execute(_RECORDED_SQL).fetchone()
    return recorded_key, recorded_format


def file_format(recorded: object) -> int:
    """The format a file's record (`_recorded`) names: 0 when there is none (read as format 1
    is, and upgraded to it). Raises NewerFileFormat for a format newer than FILE_FORMAT, and for
    a record that names no format, which no server wrote: refused rather than guessed at."""
    if recorded is None:
        return 0
    text = str(recorded)
    if text.isascii() and text.isdigit() and len(text) <= _FORMAT_DIGITS and int(text) <= FILE_FORMAT:
        return int(text)
    raise NewerFileFormat(text, FILE_FORMAT)


def read_file_format(conn: sqlite3.Connection) -> int:
    """`file_format` of a file that may have no `_sessions_meta` table (one brought in)."""
    if not table_exists(conn, "_sessions_meta"):
        return 0
    return file_format(_recorded(conn)[1])


def read_row_writes(conn: sqlite3.Connection) -> int:
    """Rows written by this service so far (saved when the object closes; a crash loses the count
    since the last clean close, never data)."""
    row = conn.execute("SELECT value FROM _sessions_meta WHERE key = 'row_writes'").fetchone()
    try:
        return int(row[0]) if row else 0
    except ValueError:
        return 0


def write_row_writes(conn: sqlite3.Connection, count: int) -> None:
    conn.execute("INSERT OR REPLACE INTO _sessions_meta (key, value) VALUES ('row_writes', ?)", (str(count),))


def read_schema_version(conn: sqlite3.Connection) -> int:
    """Decodes the V8-serialized version record; anything unreadable counts as 0 (lift again)."""
    row = conn.execute("SELECT value FROM _cf_KV WHERE key = ?", (SCHEMA_VERSION_KEY,)).fetchone()
    if row is None or not isinstance(row[0], bytes):
        return 0
    return decode_v8_small_int(row[0])


def decode_v8_small_int(data: bytes) -> int:
    """The integer in a V8-serialized Int32 ('I') or Uint32 ('U') value; 0 if it is neither."""
    pos = 0
    while pos < len(data) and data[pos] == 0xFF:  # version header(s)
        pos += 2
    while pos < len(data) and data[pos] == 0x00:  # padding
        pos += 1
    if pos >= len(data) or data[pos] not in (0x49, 0x55):
        return 0
    tag = data[pos]
    value = 0
    shift = 0
    for byte in data[pos + 1 :]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    if tag == 0x49:
        value = (value >> 1) ^ -(value & 1)
    return value


def holds(conn: sqlite3.Connection, name: str) -> bool:
    """Whether the schema holds anything (table, index, ...) named `name`."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def table_exists(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", (name,)).fetchone()
    return row is not None


def lift_legacy_tables(conn: sqlite3.Connection) -> bool:
    """Copies `assistant_*` rows (agents <= 0.22) into upstream's tables (reference notes §10).

    Sources are dropped only when every row has a copy with the same payload; otherwise they stay
    and the lift reports itself incomplete, so the version stays unstamped and it runs again on the
    next open. Returns whether the lift is complete.
    """
    complete = True
    if table_exists(conn, "assistant_messages"):
        conn.execute(
            """INSERT OR IGNORE INTO cf_agents_session_messages
                 (session_id, id, seq, parent_id, role, content, token_estimate, created_at)
               SELECT session_id, id,
                 ROW_NUMBER() OVER (PARTITION BY session_id ORDER BY created_at ASC, rowid ASC),
                 parent_id, role, content,
                 CAST(LENGTH(CAST(content AS BLOB)) / 4 AS INTEGER),
                 COALESCE(CAST(strftime('%s', created_at) AS INTEGER), 0) * 1000
               FROM assistant_messages"""
        )
        if table_exists(conn, "cf_agents_session_fts"):
            backfill_fts(conn)
        complete &= _drop_when_copied(conn, "assistant_messages", "cf_agents_session_messages", "content")
    if table_exists(conn, "assistant_compactions"):
        conn.execute(
            """INSERT OR IGNORE INTO cf_agents_session_compactions
                 (session_id, id, seq, summary, from_message_id, to_message_id, created_at)
               SELECT session_id, id,
                 ROW_NUMBER() OVER (PARTITION BY session_id ORDER BY created_at ASC, rowid ASC),
                 summary, from_message_id, to_message_id,
                 COALESCE(CAST(strftime('%s', created_at) AS INTEGER), 0) * 1000
               FROM assistant_compactions"""
        )
        complete &= _drop_when_copied(conn, "assistant_compactions", "cf_agents_session_compactions", "summary")
    for name in ("assistant_sessions", "assistant_fts"):
        if table_exists(conn, name):
            conn.execute(f"DROP TABLE {name}")
    return complete


def _drop_when_copied(conn: sqlite3.Connection, source: str, destination: str, payload: str) -> bool:
    total, copied = conn.execute(
        f"""SELECT
              (SELECT COUNT(*) FROM {source}),
              (SELECT COUNT(*) FROM {source} AS legacy
                 JOIN {destination} AS lifted
                   ON lifted.session_id = legacy.session_id
                  AND lifted.id = legacy.id
                  AND lifted.{payload} = legacy.{payload})"""
    ).fetchone()
    if total == copied:
        conn.execute(f"DROP TABLE {source}")
        return True
    return False


def backfill_fts(conn: sqlite3.Connection) -> None:
    """Indexes message rows that have no FTS row yet (used by the lift when an index exists)."""
    conn.execute(FTS_LOOKUP_DDL)  # one lookup per message below, not a scan of the index
    use_json_text_function(conn)
    text = message_text_sql("""CASE WHEN json_valid(m.content) THEN m.content ELSE '{"parts":[]}' END""")
    conn.execute(
        f"""INSERT INTO cf_agents_session_fts (id, session_id, role, content)
           SELECT id, session_id, role, text FROM (
               SELECT m.id, m.session_id, m.role, {text} AS text
                 FROM cf_agents_session_messages AS m
                WHERE NOT EXISTS (SELECT 1 FROM cf_agents_session_fts_content AS f
                                  WHERE f.c1 = m.session_id AND f.c0 = m.id))
            WHERE text IS NOT NULL"""
    )
