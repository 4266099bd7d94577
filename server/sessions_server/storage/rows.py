"""Plain records that cross the storage boundary: what a row holds, what a write asks for."""

from __future__ import annotations

import errno
import sqlite3
import sys
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
    slices: list[str]
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
    writer allowed (`NewRow.max_inline_bytes`); nothing of it was written."""

    def __init__(self, message_id: str, inline_bytes: int, limit: int) -> None:
        super().__init__(f"{message_id!r}: {inline_bytes} bytes with its attachments inline, past {limit}")
        self.message_id = message_id
        self.inline_bytes = inline_bytes
        self.limit = limit


class StorageError(Exception):
    """SQLite failed (I/O error, disk full, corruption); the transaction was rolled back.
    `out_of_space`: the failure, `cause`, was the disk (or the file size limit) refusing to
    let a file grow, which freeing space cures, as opposed to a failing disk. As far as the
    error tells: SQLite reports a write the file size limit refused outright as an I/O error."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.out_of_space = cause is not None and is_out_of_space(cause)


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
