"""Rules for the names callers choose: object keys and session ids.

An object key never becomes a path (storage hashes it), so these rules exist for operators and
logs, not for safety of the file system: no control characters, bounded length.
"""

from __future__ import annotations

import unicodedata

from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.errors import InvalidArgument
from sessions_server.storage.paths import FILE_SUFFIX, object_file_name

MAX_OBJECT_KEY_BYTES = 1024
# The most --max-object-key-bytes may be: clients send the key in a header too, up to three
# times as long percent-encoded, and the server makes room for headers carrying any key up to it.
LARGEST_KEY_LIMIT_BYTES = 64 * 1024
MAX_SESSION_ID_BYTES = 1024


def check_object_key(key: str, *, max_bytes: int = MAX_OBJECT_KEY_BYTES) -> None:
    """Raises InvalidArgument (INVALID_OBJECT_KEY) unless `key` is a usable object key."""
    if not key:
        raise InvalidArgument("object_key must not be empty", reason="INVALID_OBJECT_KEY", field="object_key")
    size = utf8_length(key)
    if size > max_bytes:
        raise InvalidArgument(
            f"object_key is {size} bytes; the limit is {max_bytes} bytes",
            reason="INVALID_OBJECT_KEY",
            field="object_key",
            limit="max_object_key_bytes",
            limit_value=str(max_bytes),
            limit_bytes=str(max_bytes),  # the first name it had, kept for callers that read it
        )
    for index, char in enumerate(key):
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise InvalidArgument(
                f"object_key holds a control character (U+{ord(char):04X}) at index {index}",
                reason="INVALID_OBJECT_KEY",
                field="object_key",
            )


def check_session_id(session_id: str, *, max_bytes: int = MAX_SESSION_ID_BYTES) -> None:
    """Session ids are free-form as upstream, only bounded in length."""
    size = utf8_length(session_id)
    if size > max_bytes:
        raise InvalidArgument(
            f"session_id is {size} bytes; the limit is {max_bytes} bytes",
            field="session_id",
            limit="max_session_id_bytes",
            limit_value=str(max_bytes),
            limit_bytes=str(max_bytes),  # the first name it had, kept for callers that read it
        )


def file_digest(object_key: str) -> str:
    """The hex digest its object's file is named by: what names the object in logs without its
    key (a tenant's name, perhaps)."""
    return object_file_name(object_key).removesuffix(FILE_SUFFIX)
