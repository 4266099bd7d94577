"""Plain records that cross the storage boundary: what a row holds, what a write asks for."""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

# Upstream's path cap: the root is depth 0, so a path holds at most 10,001 stored rows.
MAX_PATH_DEPTH: Final = 10_000
COMPACTION_PREFIX: Final = "compaction_"


@dataclass(slots=True)  # not frozen: built per row on every read, and frozen init costs 5x
class RowInfo:
    """The lifted columns of a message row."""

    id: str
    role: str
    parent_id: str | None
    seq: int
    created_at_ms: int
    token_estimate: int


@dataclass(slots=True)  # not frozen: built per row on every read, and frozen init costs 5x
class StoredMessage:
    """A message row with its content reassembled from the row and its continuation rows.

    `stamped` is true when the row carries a content digest: only writers that validated the
    message (upstream 0.32+, this service) stamp one, so such content needs no re-validation.
    """

    info: RowInfo
    content: str
    stamped: bool


@dataclass(frozen=True, slots=True)
class PayloadRow:
    """An attachment payload to store under its content address."""

    hash: str
    media_type: str
    data: bytes


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class NewRow:
    """A message ready to write: stored JSON cut into slices, its stamps, the attachment
    payloads it introduces, every address its stored form references, and its search text."""

    id: str
    role: str
    slices: Sequence[str]  # the stored JSON cut into rows, root slice first
    digest: str
    token_estimate: int
    payloads: tuple[PayloadRow, ...] = ()
    references: tuple[str, ...] = ()
    search_text: str = ""
    # How often the stored form names each of `references`, and the most bytes the message may
    # read back as with its payloads inline (0: unchecked): a few bytes of pointers to one
    # large payload, repeated, would read back as any size.
    reference_uses: tuple[int, ...] = ()
    max_inline_bytes: int = 0
    # The hashes a read restores in a message's stored JSON, once per place (the domain's rule):
    # a payload this row brings may be one that messages already stored named before it existed,
    # and those are measured again by it. Set whenever `payloads` is.
    restored_pointers: Callable[[str], Sequence[str]] | None = None


@dataclass(slots=True)  # not frozen: built per row on every read, and frozen init costs 5x
class PathStat:
    """One row on a path: stored bytes (row, continuations, attachments) and token estimate."""

    id: str
    role: str
    bytes: int
    token_estimate: int


@dataclass(frozen=True, slots=True)
class PathStats:
    """A path root to leaf without content. `walked` counts stored rows visited, hidden
    overlay rows included, and `oldest_id` is the oldest of them: the depth cap is judged on
    the unfiltered walk."""

    rows: list[PathStat]
    walked: int
    oldest_id: str | None
    # Some row of the session names a payload the object does not hold: its bytes count when the
    # payload arrives, whichever session brings it, so the path's sizes may change without a
    # change to the session.
    dangling: bool = False
    # The parent the walk stopped at when no row holds it (a row imported under a parent not
    # stored): a row stored later under that id joins the path's root to more rows.
    open_parent: str | None = None


@dataclass(frozen=True, slots=True)
class Compaction:
    """A stored compaction record."""

    id: str
    seq: int
    summary: str
    from_message_id: str
    to_message_id: str
    created_at_ms: int


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class AppendOutcome:
    """What an append did: inserted a row, or found the id already present."""

    inserted: bool
    info: RowInfo
    existing: StoredMessage | None


@dataclass(frozen=True, slots=True)
class UpdateOutcome:
    """What an update did: `missing`, `unchanged` or `updated`."""

    status: str
    info: RowInfo | None


class Parent:
    """How an append picks its parent: the session tail, a new root, or a named message."""

    __slots__ = ("kind", "message_id")

    def __init__(self, kind: str, message_id: str = "") -> None:
        self.kind = kind
        self.message_id = message_id

    @classmethod
    def auto(cls) -> Parent:
        return cls("auto")

    @classmethod
    def root(cls) -> Parent:
        return cls("root")

    @classmethod
    def of(cls, message_id: str) -> Parent:
        return cls("id", message_id)


class StoredRowUnreadable(Exception):
    """An append's id is taken by a row whose content does not parse as a message."""


class QueryInterrupted(Exception):
    """A query ran past its deadline and was interrupted."""


class QueryRejected(Exception):
    """SQLite refused a query built from caller input (e.g. an FTS expression)."""


class InlineTooLarge(Exception):
    """A message that would read back, its attachment payloads inline, as more bytes than its
    writer allowed (`NewRow.max_inline_bytes`); nothing of it was written. `grown`: not the
    message written but a stored one, (session id, message id), that named a payload the
    written message brings before the object held it, and would read back so with it."""

    def __init__(self, message_id: str, inline_bytes: int, limit: int, grown: tuple[str, str] | None = None) -> None:
        super().__init__(f"{message_id!r}: {inline_bytes} bytes with its attachments inline, past {limit}")
        self.message_id = message_id
        self.inline_bytes = inline_bytes
        self.limit = limit
        self.grown = grown


class StorageError(Exception):
    """SQLite failed (I/O error, disk full, corruption); the transaction was rolled back.
    `out_of_space`: the failure, `cause`, was the disk (or the file size limit) refusing to
    let a file grow, which freeing space cures, as opposed to a failing disk. As far as the
    error tells: SQLite reports a write the file size limit refused outright as an I/O error."""

    def __init__(
        self,
        message: str,
        *,
        cause: BaseException | None = None,
        operation: str = "",
        permission_denied: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.out_of_space = cause is not None and is_out_of_space(cause)
        # What the store was doing ("open", "read", "write", ...): for the server's log.
        self.operation = operation
        # The OS refused the file for lack of permission (its mode, its owner): the operator's
        # to fix, and the message says so.
        if permission_denied is None:
            permission_denied = cause is not None and is_permission_denied(cause)
        self.permission_denied = permission_denied


class ObjectDamaged(StorageError):
    """The object's file cannot be served as it is: SQLite reports it corrupt or not a database
    (`damage_code`), a text in it does not decode, or it is another program's SQLite database
    (`foreign`). Nothing was written
    to it; the registry refuses the object from then on without touching the file, until it is
    erased or replaced (`ObjectRegistry.forget_damage`). `str()` is SQLite's (or the schema
    check's) own words, or `UNDECODABLE_TEXT`, for the server's log."""

    def __init__(
        self, message: str, *, cause: BaseException | None = None, operation: str = "", foreign: bool = False
    ) -> None:
        super().__init__(message, cause=cause, operation=operation, permission_denied=False)
        self.foreign = foreign
        # The registry has seen it (and quarantined the key, or found the store no longer the
        # key's: one closed for an erase or a replacement); whoever answers it leaves it there.
        self.judged = False

    def again(self, operation: str) -> ObjectDamaged:
        """The same refusal for a later call (a new exception: raising one instance over and
        over would grow its traceback with every call)."""
        repeated = ObjectDamaged(str(self), operation=operation, foreign=self.foreign)
        repeated.judged = self.judged
        return repeated


class NewerFileFormat(StorageError):
    """The object's file records a format of this service's files (`schema.FILE_FORMAT`) that
    this server does not know: a newer server wrote it, and this one, rolled back, would misread
    it. The file is fine, so this is not ObjectDamaged and nothing quarantines it: a server at
    least as new as its writer serves it. Raised on open, before anything is written to it.
    `recorded` is the file's record as it stands (a number, unless someone wrote otherwise)."""

    def __init__(self, recorded: str, known: int) -> None:
        super().__init__(
            f"the file is in format {shortened(recorded, 32)} of this service's files, newer than the {known} "
            "this server knows: run a server at least as new as the one that wrote it",
            operation="open",
            permission_denied=False,
        )
        self.recorded = recorded
        self.known = known


class OutOfDescriptors(StorageError):
    """An object could not be opened: the process had as many files open as it may. Nothing was
    read or written; idle objects are being closed to make room."""


class StoreClosed(StorageError):
    """The object's store closed under a call still using it (the object was replaced or
    removed, or the server stopped): nothing was read or written."""


# No space on the device, the user's quota, or the process's file size limit (RLIMIT_FSIZE).
_OUT_OF_SPACE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def has_message_fields(value: Any) -> bool:
    """Whether parsed JSON is a message as reads take one (an object with a string id and role
    and a list of parts): what a stamp vouches for, and what upstream's reads require."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("id"), str)
        and isinstance(value.get("role"), str)
        and isinstance(value.get("parts"), list)
    )


def is_out_of_space(exc: BaseException) -> bool:
    """Whether `exc` says the disk refused to let a file grow: by SQLite's result code or the OS
    error number, never by the words of the message."""
    if isinstance(exc, StorageError):
        return exc.out_of_space
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL
    if isinstance(exc, OSError):
        return exc.errno in _OUT_OF_SPACE_ERRNOS
    return False


# SQLite's primary result codes for a file that is damaged (a page that does not parse, a file
# cut short) or is no database at all (a garbage header, another kind of file).
_DAMAGE_CODES: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


UNDECODABLE_TEXT: Final = "a text stored in the file is not UTF-8 (its bytes were changed on disk)"


def is_undecodable_text(exc: BaseException) -> bool:
    """Whether `exc` is Python's sqlite3 failing to decode a stored TEXT value as UTF-8. Every
    text this service (or upstream) writes is UTF-8, so bytes changed on disk inside a message
    read so far more often than as a malformed page. The module raises it as OperationalError
    with no SQLite result code (SQLite itself saw nothing wrong): the one OperationalError
    without `sqlite_errorcode` a query can raise."""
    return isinstance(exc, sqlite3.OperationalError) and not hasattr(exc, "sqlite_errorcode")


def is_damage(exc: BaseException) -> bool:
    """Whether `exc` is SQLite reporting the file corrupt or not a database, by its result code
    (never by the words of the message), or a stored text that does not decode."""
    if isinstance(exc, ObjectDamaged):
        return True
    if is_undecodable_text(exc):
        return True
    return isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", 0) & 0xFF in _DAMAGE_CODES


def damage_from(exc: BaseException, operation: str) -> ObjectDamaged:
    """The ObjectDamaged for `exc`, a damage (`is_damage`). Its words are SQLite's, but for a
    text that does not decode, whose error quotes the text: a message's content stays out of
    the log and of answers."""
    if isinstance(exc, ObjectDamaged):
        return exc
    return ObjectDamaged(UNDECODABLE_TEXT if is_undecodable_text(exc) else str(exc), cause=exc, operation=operation)


def damage_or_failure(exc: BaseException, message: str, operation: str) -> StorageError:
    """The StorageError for a failure of SQLite (or the OS) during `operation`: ObjectDamaged
    when the file is damaged (`is_damage`), else a StorageError saying `message`."""
    if isinstance(exc, StorageError):
        return exc
    if is_damage(exc):
        return damage_from(exc, operation)
    return StorageError(message, cause=exc, operation=operation)


def is_permission_denied(exc: BaseException) -> bool:
    """Whether `exc` is the OS refusing a file for lack of permission. SQLite reports that as
    SQLITE_CANTOPEN ("unable to open database file") for the database, or SQLITE_READONLY
    ("attempt to write a readonly database"), which other causes share: the caller checks the
    file (`permission_denied_on`)."""
    if isinstance(exc, StorageError):
        return exc.permission_denied
    if isinstance(exc, OSError):
        return exc.errno in (errno.EACCES, errno.EPERM)
    return False


def permission_denied_on(path: Any, exc: BaseException) -> bool:
    """Whether SQLite's failure to open or write `path` (SQLITE_CANTOPEN, SQLITE_READONLY, or an
    OSError) comes from the file's or its directory's permissions: the process lacks read and
    write access to the file, or write access to its directory (where the -wal and -shm files
    go). Not on a read-only file system (one remounted so after disk errors, say), where access
    is refused whatever the owner and mode: an operator told to fix those would look in vain."""
    if is_permission_denied(exc):
        return True
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF if isinstance(exc, sqlite3.Error) else 0
    if code not in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH):
        return False
    try:
        if _on_read_only_file_system(os.path.dirname(path) or "."):
            return False
        if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
            return True
        return not os.access(os.path.dirname(path) or ".", os.W_OK | os.X_OK)
    except (OSError, ValueError):
        return False


def _on_read_only_file_system(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def utf8_length(text: str) -> int:
    """Length of `text` in UTF-8 bytes (a lone surrogate counts 3, as upstream measures it)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def shortened(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how long it was: for a text of any length
    (a name, a key, a message from SQLite) quoted in an error."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def held_bytes(text: str) -> int:
    """What `text` takes in memory, or encoded as UTF-8 if that is more: CPython keeps a string
    at 1, 2 or 4 bytes a character, by its widest one, so one emoji in ASCII text makes it take
    four times its UTF-8 length."""
    return max(sys.getsizeof(text), utf8_length(text))
