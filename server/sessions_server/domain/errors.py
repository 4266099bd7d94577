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


def storage_failure(message: str, *, out_of_space: bool) -> SessionsError:
    """The answer to a storage failure: out of space (the disk, or the file size limit) is
    RESOURCE_EXHAUSTED with STORAGE_FULL, anything else UNAVAILABLE with STORAGE_FAILURE."""
    if out_of_space:
        return LimitExceeded(f"{message}; free disk space on the server", reason="STORAGE_FULL")
    return StorageFailure(message)


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
