"""Errors the domain raises for bad input or unmet conditions.

Each carries a reason from the contract's ErrorReason enum (as its name without the prefix), a
human-readable message and metadata (which field, which limit). The transport maps the class to a
gRPC status code; nothing here knows about gRPC.
"""

from __future__ import annotations


class SessionsError(Exception):
    """Base class: a failure the caller can act on."""

    reason = "UNSPECIFIED"

    def __init__(self, message: str, *, reason: str | None = None, **metadata: str) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.metadata = metadata


class InvalidArgument(SessionsError):
    """The request is malformed; nothing was written."""

    reason = "INVALID_FIELD"


class LimitExceeded(SessionsError):
    """A configured limit was exceeded; nothing was written."""

    reason = "LIMIT_EXCEEDED"


class NotFound(SessionsError):
    """A thing the caller named by id does not exist (where upstream has no null answer)."""

    reason = "NOT_FOUND"


class FailedPrecondition(SessionsError):
    """The request is well-formed but the stored state does not allow it."""

    reason = "FAILED_PRECONDITION"


class Unavailable(SessionsError):
    """The server cannot serve the request now (draining, the object moving, the summarizer or
    the change feed failing); retrying, here or elsewhere, may work. The reason says which."""

    reason = "DRAINING"


class Unauthenticated(SessionsError):
    """The call carries no valid credentials."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(SessionsError):
    """The credentials do not grant this call."""

    reason = "PERMISSION_DENIED"


class StorageFailure(SessionsError):
    """The storage engine failed (an I/O error, a damaged file): a write was rolled back, a read
    returned nothing."""

    reason = "STORAGE_FAILURE"


class DataLoss(SessionsError):
    """The object's stored data cannot be served: its file is damaged, or is not an object file
    at all. Nothing was written to it; retrying cannot help, an operator must act (DATA_LOSS)."""

    reason = "OBJECT_DAMAGED"


def object_damaged(relative_path: str, detail: str, *, foreign: bool) -> DataLoss:
    """The answer to every call on an object whose file SQLite reports corrupt or not a database
    (`detail`, SQLite's words) or holds a text that does not decode, or which is another
    program's SQLite database (`foreign`): what the operator does about it."""
    if foreign:
        what = (
            f"the file at the object's path ({relative_path}) is not a Sessions object file: it is another "
            "program's SQLite database, holding neither this service's tables nor upstream's. It was left as it is"
        )
        remedy = (
            "on the server, move that file out of the data directory, or restore the object's own file from a "
            "backup or replica (ImportObject with replace), or erase the key (DeleteObject with erase)"
        )
    else:
        what = f"the object's file ({relative_path}) is damaged ({detail}). Nothing was written to it"
        remedy = (
            "restore the object from a backup or replica (ImportObject with replace), or erase it (DeleteObject "
            "with erase) to start it afresh"
        )
    return DataLoss(
        f"{what}, and every call on this object is refused until an operator acts: {remedy}. Retrying will not help",
        file=relative_path,
    )


def permission_denied(relative_path: str) -> StorageFailure:
    """The answer to an object's file the server may not open: its mode or owner (or its
    directory's) keep the server's user out. UNAVAILABLE with STORAGE_FAILURE, as the operator
    can fix it without the caller."""
    return StorageFailure(
        f"could not open the object's file ({relative_path}) for lack of permission: the server's user may not "
        "read and write it, or write to its directory; nothing was written. The server's operator fixes the "
        "owner or mode of the file or its directory",
        file=relative_path,
    )


def storage_failure(message: str, *, out_of_space: bool, **metadata: str) -> SessionsError:
    """The answer to a storage failure: out of space (the disk, or the file size limit) is
    RESOURCE_EXHAUSTED with STORAGE_FULL, anything else UNAVAILABLE with STORAGE_FAILURE."""
    if out_of_space:
        return LimitExceeded(f"{message}; free disk space on the server", reason="STORAGE_FULL", **metadata)
    return StorageFailure(message, **metadata)


def file_of_another_object(relative_path: str) -> FailedPrecondition:
    """The answer to an object whose file records another key: one copied or restored to this
    key's path by hand. Neither key's calls may use it (they would mix two objects); an operator
    moves it to where it belongs. Which key it records is not said: the caller's grant may not
    cover that key."""
    return FailedPrecondition(
        f"the object's file ({relative_path}) records another object's key: it was copied or restored to "
        "this key's path by hand. Nothing was read from it or written to it: on the server, move the file "
        "(with any -wal file) to its own key's path or out of the data directory, or erase this key "
        "(DeleteObject with erase) to remove it",
        file=relative_path,
    )


def file_of_a_newer_server(relative_path: str, recorded: str, known: int) -> FailedPrecondition:
    """The answer to an object whose file records a format of this service's files newer than
    this server knows (`recorded`, `known`): a newer server wrote it, and this one, rolled back,
    would misread it. The file is fine and left as it is; retrying here cannot help, a server at
    least as new as its writer serves it."""
    return FailedPrecondition(
        f"the object's file ({relative_path}) is in format {recorded} of this service's files, newer than the "
        f"{known} this server knows: a newer server wrote it, and this one would misread it. Nothing was read "
        "from it or written to it: run a server at least as new as the one that wrote it",
        file=relative_path,
    )
