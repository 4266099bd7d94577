"""Whole object files in and out: importing a store written by upstream (or by another server).

The file format is upstream's, so importing is a consistent copy (SQLite's backup API, which also
takes what sits in a WAL) into the object's path, followed by the same open as every object gets:
schema upgrade, key record, and the legacy lift.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from sessions_server.storage import import_checks, queries, schema
from sessions_server.storage.datadir import SCRATCH_DIR_NAME, make_directories, sync_directories
from sessions_server.storage.paths import (
    FANOUT_LOCK,
    FILE_SUFFIX,
    OBJECTS_DIR,
    object_path,
    prune_object_directories,
)
from sessions_server.storage.rows import (
    ObjectDamaged,
    StorageError,
    damage_or_failure,
    has_message_fields,
    is_damage,
    shortened,
)


class StoreImportError(Exception):
    """The file cannot be imported (missing, not SQLite, or the object exists)."""


class ObjectExists(StoreImportError):
    """The object is already stored here, and the import was not asked to replace it."""


@dataclass(frozen=True, slots=True)
class TextLimit:
    """The longest text (UTF-8 bytes) a column may hold; `name` names the limit in errors."""

    table: str
    column: str
    max_bytes: int
    name: str


@dataclass(frozen=True, slots=True)
class ReadBack:
    """How large a message may read back with its attachments inline (`limit` bytes), and the
    attachment hashes a read restores in a message's stored JSON (`pointers`, in the order and
    number of the places it restores them)."""

    limit: int
    pointers: Callable[[str], Sequence[str]]


class OversizedText(StoreImportError):
    """A row of the file holds a text past a limit: its reads could not be answered."""

    def __init__(self, limit: TextLimit, size: int, row: str) -> None:
        super().__init__(
            f"{row}: its {limit.column} is {size} bytes; the limit is {limit.max_bytes} bytes ({limit.name})"
        )
        self.limit = limit


class UndecodableValue(StoreImportError):
    """A row of the file holds a text that is not UTF-8: every read of it would fail, and the
    object would be taken for damaged once installed."""

    def __init__(self, row: str, column: str) -> None:
        super().__init__(f"{row}: its {column} is not UTF-8 text")


class MistypedValue(StoreImportError):
    """A row of the file holds a value of another kind than its column declares (SQLite checks
    no types): its reads would fail, or read it as something it is not."""

    def __init__(self, row: str, column: str, found: str, declared: str) -> None:
        super().__init__(f"{row}: its {column} holds {found}, where its column declares {declared}")


# How an error names a row of each of the service's tables: its key columns.
_ROW_KEYS = {
    "cf_agents_session_messages": ("session_id", "id"),
    "cf_agents_session_message_chunks": ("session_id", "id", "idx"),
    "cf_agents_session_compactions": ("session_id", "id"),
    "cf_agents_session_config": ("session_id", "key"),
    "cf_agents_session_attachment_meta": ("hash",),
    "cf_agents_session_attachment_chunks": ("hash", "idx"),
    "cf_agents_session_attachment_refs": ("session_id", "message_id", "hash"),
}
_ROW_NOUNS = {
    "cf_agents_session_messages": "message",
    "cf_agents_session_message_chunks": "continuation row",
    "cf_agents_session_compactions": "compaction",
    "cf_agents_session_config": "config entry",
    "cf_agents_session_attachment_meta": "attachment",
    "cf_agents_session_attachment_chunks": "attachment chunk",
    "cf_agents_session_attachment_refs": "attachment reference",
}
# The storage classes a value of each declared type holds in a file this service or upstream
# wrote: SQLite's affinity turns an integral number into an INTEGER and a number into TEXT, and
# keeps a fraction as a REAL (upstream's importMessage stores `createdAt: 1.5` so; reads take
# its integer part). Anything else was put there by hand (a created_at of 'yesterday', chunk
# data as text), and reads would fail on it or read it as something else.
_STORAGE_CLASSES = {"INTEGER": ("integer", "real"), "TEXT": ("text",), "BLOB": ("blob",)}
QUOTED_KEY_CHARS = 64
SQLITE_MESSAGE_CHARS = 500  # SQLite's errors quote the file's names, which run to any length
_STORAGE_FAILURES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the file at `path`, whatever its name holds: in a URI, a `?` or
    `#` in a path ends it, and SQLite opened (creating it) the file named by what came before,
    writable. `as_uri` escapes them."""
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)


def import_store_file(
    source: Path,
    object_key: str,
    data_dir: Path,
    *,
    replace: bool = False,
    text_limits: Sequence[TextLimit] = (),
    read_back: ReadBack | None = None,
) -> Path:
    """Copies `source` in as `object_key`; returns the object's path. The caller owns `data_dir`
    (holds its lock, see `datadir`) and does not have the object open. A file that fails
    SQLite's integrity check or `import_checks`, holds a text past one of `text_limits`, or a
    message that reads back, its attachments inline, past `read_back` (OversizedText), is
    refused and nothing is installed."""
    if not source.is_file():
        raise StoreImportError(f"{source} is not a file")
    target = object_path(data_dir, object_key)
    if target.exists() and not replace:
        raise ObjectExists(f"object {object_key!r} already exists")
    # Staged in scratch (the same file system: the rename below stays atomic), which the
    # directory's owner empties at start, so a crash mid-import leaves nothing behind for good.
    scratch = data_dir / SCRATCH_DIR_NAME
    scratch.mkdir(parents=True, exist_ok=True)
    partial = scratch / f"{target.stem}.importing"
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    rewritten = scratch / f"{target.stem}.importing-pages"
    try:
        src = open_read_only(source)
        dst = sqlite3.connect(partial)
        try:
            src.backup(dst)
        finally:
            src.close()
        with contextlib.ExitStack() as closing:
            closing.callback(lambda: dst.close())  # the connection in use when it ends
            import_checks.check_schema(dst)  # before anything of the file runs
            _check_integrity(dst)  # the copy: a corrupt source would fail every later read of it
            if dst.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None:
                # An empty file (a sender that sent nothing) is a valid database: installed, it
                # would replace an object's messages with none. Every store has tables once opened.
                raise StoreImportError(f"{source} is an empty database (no tables): not a store")
            dst = _take_server_pages(dst, partial, rewritten)
            dst.isolation_level = None
            had_refs_index = schema.holds(dst, schema.REFS_BY_HASH_INDEX)
            if schema.table_exists(dst, "_sessions_meta"):  # the copy takes the new key
                dst.execute("DELETE FROM _sessions_meta WHERE key = 'object_key'")
            schema.initialize(dst, object_key)
            _check_text_sizes(dst, text_limits)
            _check_column_types(dst)
            _check_texts_decode(dst)
            import_checks.check_attachments(dst)
            if read_back is not None:
                _check_read_back_sizes(dst, read_back)
            if had_refs_index:  # else the upgrade in `initialize` rebuilt them
                dst.execute("BEGIN")
                queries.reconcile_attachment_refs(dst)
                dst.execute("COMMIT")
            _unstamp_mismatched_rows(dst)
            if queries.search_index_problem(dst) is not None:  # derived from the messages: built again
                queries.drop_search_index(dst)
            queries.backfill_partial_index(dst)
    except sqlite3.DatabaseError as exc:
        _remove_staged(partial, rewritten)
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _STORAGE_FAILURES:  # the disk, not the file
            raise StorageError(f"storage failed, nothing was imported: {exc}", cause=exc) from exc
        raise StoreImportError(
            f"{source} is not a usable SQLite store: {shortened(str(exc), SQLITE_MESSAGE_CHARS)}"
        ) from exc
    except import_checks.UnsafeFile as exc:
        _remove_staged(partial, rewritten)
        raise StoreImportError(f"{source} {exc}") from None
    except ObjectDamaged as exc:  # another program's database: served, it would be taken over
        _remove_staged(partial, rewritten)
        raise StoreImportError(f"{source} is {exc}") from None
    except BaseException:  # a refusal, the disk, or the process stopping (SIGTERM, Ctrl-C)
        _remove_staged(partial, rewritten)
        raise
    if target.exists() and _replace_in_place(partial, target):
        remove_object_files(partial)
        return target
    # The rename swaps the object atomically (a crash leaves the old file or the new one). The
    # old file's WAL must go first, or SQLite would apply it to the new one; so first every
    # commit in it is moved into the old file itself.
    if target.exists():
        _checkpoint_completely(target)
    _remove_wal_files(target)
    with FANOUT_LOCK:  # made with the file, so that no erase beside it removes them between
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.replace(target)
    # The copy's bytes were synced by its commit; its name, and the directories a first object
    # in them created, are durable only once their directories are. ImportObject answers after
    # this, and a move then deletes the source.
    sync_directories(target.parent, data_dir)
    return target


def _remove_staged(*paths: Path) -> None:
    """Removes staged copies with their journals (a disk that filled mid-write left one)."""
    for path in paths:
        for suffix in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(path) + suffix).unlink()


def has_server_pages(path: Path) -> bool:
    """Whether the SQLite file at `path` has the page size of the files this server makes (its
    header's, read without opening it as a database)."""
    with open(path, "rb") as file:
        header = file.read(18)
    size = int.from_bytes(header[16:18], "big") if len(header) == 18 else 0
    return (65536 if size == 1 else size) == schema.NEW_FILE_PAGE_SIZE


def _take_server_pages(conn: sqlite3.Connection, staged: Path, rewritten: Path) -> sqlite3.Connection:
    """Rewrites a staged copy to the page size of the files this server makes (upstream's are of
    4 KiB); the connection to use from then on. A file of another page size at an object's path
    stopped Litestream replicating that object for good (every sync: "unaligned wal offset"),
    the one installed here and any made at that path after an erase; and it could not replace
    an object in place. `VACUUM INTO` writes the new file beside it: a VACUUM in place took a
    rollback journal in scratch and a temporary database in the system's temporary directory,
    each nearly as large, which the room kept for the install did not count (an upstream file of
    683 MB took the disk's last bytes and failed other objects' writes)."""
    if conn.execute("PRAGMA page_size").fetchone()[0] == schema.NEW_FILE_PAGE_SIZE:
        return conn
    with contextlib.suppress(FileNotFoundError):
        rewritten.unlink()
    conn.execute(f"PRAGMA page_size = {schema.NEW_FILE_PAGE_SIZE}")
    conn.execute("VACUUM INTO ?", (str(rewritten),))
    conn.close()
    _remove_wal_files(staged)
    rewritten.replace(staged)
    return sqlite3.connect(staged)


def _replace_in_place(staged: Path, target: Path) -> bool:
    """Writes the staged copy's pages into the object's file through SQLite, in one transaction
    (a crash leaves the old object or the new one): a replicator that keeps the file open and
    reads its WAL (Litestream) sees an ordinary commit. Swapping the file instead left such a
    replica corrupt (it went on reading the old inode's database with the new file's WAL), and
    the swap's checkpoint waited on the replicator's read transaction, so it was refused. False
    when the pages cannot go in place (another page size, which a WAL file cannot take; a file
    SQLite cannot open): the caller swaps the file then."""
    try:
        with (
            contextlib.closing(open_read_only(staged)) as src,
            contextlib.closing(sqlite3.connect(target, timeout=30)) as dst,
        ):
            same_pages = src.execute("PRAGMA page_size").fetchone() == dst.execute("PRAGMA page_size").fetchone()
            if not same_pages or dst.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                return False
            dst.execute("PRAGMA synchronous = FULL")  # the commit that installs it is durable
            src.backup(dst)
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _STORAGE_FAILURES:
            raise StorageError(f"the object could not be replaced, nothing was imported: {exc}", cause=exc) from exc
        return False
    return True


def _checkpoint_completely(path: Path) -> None:
    """Moves every commit in the file's WAL into the file (TRUNCATE empties the WAL), so the WAL
    may be removed without losing any. Raises StorageError when the disk fails or a reader holds
    it back; a file SQLite cannot read at all has nothing to keep, and is replaced as it is."""
    try:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _STORAGE_FAILURES:
            raise StorageError(
                f"the object being replaced could not be checkpointed, nothing was imported: {exc}", cause=exc
            ) from exc
        return
    if busy:
        raise StorageError("the object being replaced is in use elsewhere, nothing was imported")


def _check_text_sizes(conn: sqlite3.Connection, limits: Sequence[TextLimit]) -> None:
    """Raises OversizedText for the first row found past a limit: one scan of each table."""
    tables = list(dict.fromkeys(limit.table for limit in limits))
    for table in tables:
        mine = [limit for limit in limits if limit.table == table]
        sizes = ", ".join(f"length(CAST({limit.column} AS BLOB))" for limit in mine)
        past = " OR ".join(f"length(CAST({limit.column} AS BLOB)) > ?" for limit in mine)
        keys = _ROW_KEYS[table]
        row = conn.execute(
            f"SELECT {sizes}, {', '.join(keys)} FROM {table} WHERE {past} LIMIT 1",
            [limit.max_bytes for limit in mine],
        ).fetchone()
        if row is None:
            continue
        for index, limit in enumerate(mine):
            if row[index] is not None and row[index] > limit.max_bytes:
                raise OversizedText(limit, int(row[index]), _describe_row(table, row[len(mine) :]))


def _check_column_types(conn: sqlite3.Connection) -> None:
    """Raises MistypedValue for the first value found of another storage class than its column
    declares (NULL where the column allows it): one scan of each table."""
    for table in _ROW_KEYS:
        columns = [
            (str(name), _STORAGE_CLASSES[str(declared).upper()], not not_null)
            for _, name, declared, not_null, _, _ in conn.execute(f"PRAGMA table_info({table})")
            if str(declared).upper() in _STORAGE_CLASSES
        ]
        if not columns:
            continue
        wrong = " OR ".join(
            f"typeof({name}) NOT IN ({', '.join(repr(k) for k in (*kinds, 'null') if nullable or k != 'null')})"
            for name, kinds, nullable in columns
        )
        found = ", ".join(f"typeof({name})" for name, _, _ in columns)
        keys = _ROW_KEYS[table]
        row = conn.execute(f"SELECT {found}, {', '.join(keys)} FROM {table} WHERE {wrong} LIMIT 1").fetchone()
        if row is None:
            continue
        for index, (name, kinds, nullable) in enumerate(columns):
            if row[index] not in kinds and not (nullable and row[index] == "null"):
                article = "an" if row[index][0] in "aeiou" else "a"
                raise MistypedValue(
                    _describe_row(table, row[len(columns) :]), name, f"{article} {row[index]} value", kinds[0]
                )


def _unstamp_mismatched_rows(conn: sqlite3.Connection) -> None:
    """Clears the digest of each message row whose content it does not match, or whose content
    is not a message.

    Reads trust a stamped row to hold a message, the JSON its digest was taken of, and skip the
    check that an unstamped one parses (a row that does not is skipped, as upstream skips it). A
    file made elsewhere, or damaged on its way, could hold a stamp that vouches for other
    content; and upstream's importMessage stamps whatever it was given, a row its own reads skip
    (`"parts": ""`, a numeric role) included. Without the stamp the row is checked like any
    unstamped one, and an identical update stamps it again."""
    stale = []
    rows = conn.execute(
        "SELECT session_id, id, content, content_chunks, content_hash FROM cf_agents_session_messages "
        "WHERE content_hash IS NOT NULL"
    )
    for session_id, message_id, content, chunks, stamp in rows:
        text = queries.stored_json_of(conn, session_id, message_id, content, chunks)
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        if digest != stamp or not _holds_a_message(text):
            stale.append((session_id, message_id))
    if stale:
        conn.execute("BEGIN")
        conn.executemany(
            "UPDATE cf_agents_session_messages SET content_hash = NULL WHERE session_id = ? AND id = ?", stale
        )
        conn.execute("COMMIT")


def _holds_a_message(text: str) -> bool:
    """Whether `text` is a JSON object with a string id and role and a list of parts, as a stamp
    says. What orjson refuses (an integer past 64 bits, a lone surrogate) the standard library
    reads; nesting past its recursion limit, deeper than reads parse, counts as no message."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return False
    return has_message_fields(value)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: JSON.parse refuses them


def _check_texts_decode(conn: sqlite3.Connection) -> None:
    """Raises UndecodableValue for the first text found that is not UTF-8 (after
    `_check_column_types`: a TEXT column holds text or NULL). Only some columns were ever read
    on the way in; one of the others (a role, a parent id, a compaction's summary) was installed
    as it was, and every call on the object then answered that it was damaged."""
    for table, keys in _ROW_KEYS.items():
        columns = [
            str(name)
            for _, name, declared, _, _, _ in conn.execute(f"PRAGMA table_info({table})")
            if str(declared).upper() == "TEXT"
        ]
        if not columns:
            continue
        # As bytes: decoding is the check, and the row's key names it even when the key is the text.
        selected = ", ".join(f"CAST({name} AS BLOB)" for name in (*keys, *columns))
        for row in conn.execute(f"SELECT {selected} FROM {table}"):
            for name, value in zip(columns, row[len(keys) :], strict=True):
                if value is None:
                    continue
                try:
                    bytes(value).decode("utf-8")
                except UnicodeDecodeError:
                    shown = [
                        bytes(key).decode("utf-8", "replace") if key is not None else None for key in row[: len(keys)]
                    ]
                    raise UndecodableValue(_describe_row(table, shown), name) from None


def _describe_row(table: str, key_values: Sequence[object]) -> str:
    """Names a row by its key, each value cut short: the value may itself be the long one."""
    parts = []
    for column, value in zip(_ROW_KEYS[table], key_values, strict=True):
        text = str(value)
        parts.append(f"{column} {shortened(text, QUOTED_KEY_CHARS)!r}")
    return f"the {_ROW_NOUNS[table]} with {', '.join(parts)}"


def _check_integrity(conn: sqlite3.Connection) -> None:
    problems = import_checks.integrity_problems(conn)
    if problems:
        raise StoreImportError(f"integrity check failed: {'; '.join(problems[:5])}")


def _check_read_back_sizes(conn: sqlite3.Connection, read_back: ReadBack) -> None:
    """Raises OversizedText for a message that would read back past the limit, as the write
    calls refuse one: a read builds the whole of it in memory."""
    found = import_checks.first_read_back_past(conn, read_back.limit, read_back.pointers)
    if found is not None:
        session_id, message_id, size = found
        bound = TextLimit(
            "cf_agents_session_messages", "JSON with its attachments inline", read_back.limit, "max_assembly_bytes"
        )
        raise OversizedText(bound, size, _describe_row("cf_agents_session_messages", (session_id, message_id)))


def free_bytes(directory: Path) -> int:
    """Bytes free to the server on the file system holding `directory` (or, while it does not
    exist, its parent)."""
    return shutil.disk_usage(directory if directory.exists() else directory.parent).free


def snapshot_object(source: Path, scratch_dir: Path, row_writes: int) -> Path:
    """A consistent copy of a live object file (its committed state, WAL included), one file
    with no WAL beside it, and without the free pages deletes left in the object: VACUUM INTO
    writes only the pages in use, about as fast as the backup API copies every page (0.15 s
    for 115 MB here), so exports and moves do not ship what was deleted. `row_writes`, the
    object's count of rows written, which its store keeps in memory and saves only as it
    closes, is written into the copy: a copy of an open object carried the count last saved
    (none, for an object never closed), so an export, move or vacuum lost it."""
    copy = scratch_dir / f"export-{uuid.uuid4().hex}{FILE_SUFFIX}"
    try:
        scratch_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(open_read_only(source)) as src:
            src.execute("VACUUM INTO ?", (str(copy),))
        with contextlib.closing(sqlite3.connect(copy, isolation_level=None)) as conn:
            # The copy is scratch, sent or copied back and then removed (a crash's is cleared at
            # the next start): its own syncs would only add 1.5-2.4 ms to every copy here.
            conn.execute("PRAGMA synchronous = OFF")
            schema.write_row_writes(conn, row_writes)
    except (sqlite3.Error, OSError) as exc:
        # A partial copy would only take more of a full disk; its rollback journal, which the
        # copy writes beside it, stayed until the next start.
        for leftover in (copy, Path(f"{copy}-journal")):
            leftover.unlink(missing_ok=True)
        raise damage_or_failure(exc, f"could not copy the object: {exc}", "export copy") from exc
    return copy


def keep_copy(source: Path, directory: Path) -> Path | None:
    """A durable copy of the closed object file `source` in `directory`, its count of rows
    written the one saved in it: kept while a move's import holds the copy that replaced it.
    None when the file is damaged (nothing of it to keep: the import is its repair, which an
    INTERNAL error here refused)."""
    try:
        with contextlib.closing(open_read_only(source)) as conn:
            row_writes = schema.read_row_writes(conn) if schema.table_exists(conn, "_sessions_meta") else 0
        copy = snapshot_object(source, directory, row_writes)
    except ObjectDamaged:
        return None
    except sqlite3.DatabaseError as exc:
        # Only damage leaves nothing to keep: a file another process holds locked (a backup, a
        # replicator) was taken for one, and the object it replaced was lost if the move failed.
        if is_damage(exc):
            return None
        raise StorageError(f"the object could not be copied, nothing was imported: {exc}", cause=exc) from exc
    try:
        with copy.open("rb") as written:
            os.fsync(written.fileno())
        sync_directories(directory, directory.parent)
    except OSError:
        copy.unlink(missing_ok=True)
        raise
    return copy


def stage_new_object_file(path: Path, staging: Path) -> Path:
    """A new object's file for `path` (`schema.new_file_image`), written and synced in
    `staging`, scratch: on the objects' file system, and emptied at every start, so a crash
    leaves nothing behind for good. `install_new_object_file` gives it its name."""
    staging.mkdir(parents=True, exist_ok=True)
    image = schema.new_file_image(staging)
    staged = staging / f"{path.stem}.{threading.get_ident()}.new"  # one at a time per thread
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            left = memoryview(image)
            while left:
                left = left[os.write(fd, left) :]
            os.fsync(fd)  # the bytes, before any commit in the file can be acknowledged
        finally:
            os.close(fd)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged


def install_new_object_file(staged: Path, path: Path) -> bool:
    """Renames a staged new file (`stage_new_object_file`) to `path`, making its directories
    (`make_directories`), unless a file is there already: then False. Under FANOUT_LOCK. The
    staged file is gone however it ends.

    A WAL and shared-memory file left there without their file (a removal a crash cut short)
    go first: SQLite would read that WAL into the new file, the erased object's last commits
    with it (into an empty file, as SQLite makes one, it reads no WAL). The new name is durable
    by the file's first commit: SQLite syncs the directory of a WAL it creates."""
    try:
        make_directories(path.parent)
        if path.exists():
            staged.unlink()
            return False
        _remove_wal_files(path)
        staged.rename(path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return True


def _remove_wal_files(path: Path) -> None:
    """Removes the WAL and shared-memory files of the database at `path`, where there are any."""
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def remove_files_but(directory: Path, names: set[str]) -> None:
    """Removes the files in `directory` not named in `names` (what a crash left there)."""
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        for entry in entries:
            if entry.name not in names:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def remove_object_files(path: Path, trash: Path | None = None, *, prune: bool = False) -> bool:
    """Deletes an object's file with its WAL and shared-memory files; True if it existed. With
    `prune`, its directories go too once empty (`paths.prune_object_directories`).

    With `trash` (a directory emptied at every start, on the same file system), the file goes
    first, in one rename: the object is then gone at once, whatever happens next. Its WAL
    unlinked first, a crash before the file went left the object as it was at its last
    checkpoint, its later commits lost, and served. A WAL a crash leaves without its file is
    not read into the key's next file: `install_new_object_file` removes it before the new file
    takes the name (the removal tests check)."""
    existed = path.exists()
    if existed and trash is not None:
        trash.mkdir(exist_ok=True)
        gone = trash / f"{path.stem}-{time.time_ns()}{path.suffix}"
        path.replace(gone)
        sync_directories(path.parent, trash)
        _remove_wal_files(path)
        gone.unlink()
        sync_directories(path.parent, trash)
    else:
        for suffix in ("-wal", "-shm", ""):
            with contextlib.suppress(FileNotFoundError):
                Path(str(path) + suffix).unlink()
        if existed:  # else a restart after a power cut could find the moved object here again
            sync_directories(path.parent, path.parent)
    if prune:
        prune_object_directories(path)
    return existed


def set_object_files_aside(path: Path, directory: Path) -> Path | None:
    """Moves an object's file, with its WAL and shared-memory files, into `directory`, under a
    name of its own (the same object set aside twice keeps both, and no WAL is paired with
    another file); returns where the file went, None if there was none."""
    if not path.exists():
        return None
    # The WAL's commits go into the file first: a crash between the renames below then parts the
    # file from an empty WAL, not from its latest commits (the next start sets the file aside
    # again, under another name). A file that cannot be checkpointed goes as it is.
    with contextlib.suppress(StorageError):
        _checkpoint_completely(path)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.time_ns()
    while (aside := directory / f"{path.stem}-{stamp}{path.suffix}").exists():
        stamp += 1  # the clock stood still or went back: another name, not another's copy replaced
    for suffix in ("-wal", "-shm", ""):  # the file last: a crash between leaves it where it was
        with contextlib.suppress(FileNotFoundError):
            Path(str(path) + suffix).replace(str(aside) + suffix)
    sync_directories(path.parent, directory)
    return aside


def list_object_files(data_dir: Path, after: str, limit: int) -> list[Path]:
    """Object files in file-name order, after the file name `after`, at most `limit`.

    A file's two directories are its name's first two pairs of characters (`object_path`), so
    walking the directories in order visits the names in order: a page reads the directories it
    takes its files from and stops, where globbing the whole tree cost every page 2.3 s at
    200,000 objects."""
    found: list[Path] = []
    for top in _subdirectories(data_dir / OBJECTS_DIR, after[0:2]):
        for leaf in _subdirectories(top, after[2:4] if top.name == after[0:2] else ""):
            with os.scandir(leaf) as entries:
                names = sorted(e.name for e in entries if e.name.endswith(FILE_SUFFIX) and e.name > after)
            for name in names:
                found.append(leaf / name)
                if len(found) >= limit:
                    return found
    return found


def _subdirectories(parent: Path, start: str) -> list[Path]:
    """`parent`'s directories named `start` or later, in name order."""
    try:
        with os.scandir(parent) as entries:
            names = sorted(e.name for e in entries if e.name >= start and e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [parent / name for name in names]


def recorded_object_key(path: Path) -> str | None:
    """The object key recorded inside an object file, or None when unreadable."""
    try:
        conn = open_read_only(path)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT value FROM _sessions_meta WHERE key = 'object_key'").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return None if row is None else str(row[0])


def count_message_rows(path: Path) -> int:
    """The message rows of the object file at `path`. Raises StorageError when SQLite fails."""
    try:
        conn = open_read_only(path)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM cf_agents_session_messages").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StorageError(f"the installed object's rows could not be counted: {exc}", cause=exc) from exc
