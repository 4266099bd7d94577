"""Every configurable limit in one place, each with its unit in its name and its default.

A limit that is exceeded fails the call with RESOURCE_EXHAUSTED (LimitExceeded) or, for
malformed sizes, INVALID_ARGUMENT, and the ErrorInfo names the limit and its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sessions_server.domain.attachments import MAX_MEDIA_TYPE_BYTES, restored_pointers
from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.errors import InvalidArgument, LimitExceeded
from sessions_server.domain.keys import MAX_SESSION_ID_BYTES
from sessions_server.storage.files import ReadBack, TextLimit
from sessions_server.storage.rows import RowInfo
from sessions_server.storage.store import ObjectStore

GIB = 1024 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    # Largest message JSON accepted from `source=client` writes (0: no limit, as upstream).
    max_client_message_bytes: int = 32 * 1024 * 1024
    # Largest object file (database + WAL) that still accepts writes; a Durable Object's 10 GB.
    max_object_bytes: int = 10 * GIB
    # Concurrent Subscribe streams on one object.
    max_subscribers_per_object: int = 256
    # Concurrent streaming calls (server- or client-streaming) on the whole server.
    max_concurrent_streams: int = 4096
    # Of those, what one bearer token may hold (with --tokens-file): one tenant's idle feeds or
    # stalled readers must not take every slot from the others. 0: no bound of its own.
    max_streams_per_token: int = 1024
    # Longest message id: ids travel beside every frame, which must stay under 4 MiB.
    max_message_id_bytes: int = 16 * 1024
    # Longest role: roles travel beside every frame too.
    max_role_bytes: int = 16 * 1024
    # Longest compaction summary: overlays are listed and streamed whole.
    max_summary_bytes: int = 1024 * 1024
    # Bytes of messages sent in pieces (UploadMessage, ImportMessages) held at once, across
    # calls, while their pieces arrive: the bound on one such message too.
    max_assembly_bytes: int = 512 * 1024 * 1024


def stored_text_limits(limits: Limits) -> tuple[TextLimit, ...]:
    """The texts a file brought in from elsewhere (import-store, ImportObject) may hold: what
    reads send beside each frame, bounded as the write calls bound them, so that every row it
    brings can be read."""
    messages = "cf_agents_session_messages"
    compactions = "cf_agents_session_compactions"
    session_ids = [
        TextLimit(table, "session_id", MAX_SESSION_ID_BYTES, "max_session_id_bytes")
        for table in (messages, compactions, "cf_agents_session_config")
    ]
    ids = limits.max_message_id_bytes
    return (
        *session_ids,
        TextLimit(messages, "id", ids, "max_message_id_bytes"),
        TextLimit(messages, "parent_id", ids, "max_message_id_bytes"),
        TextLimit(messages, "role", limits.max_role_bytes, "max_role_bytes"),
        TextLimit(compactions, "id", ids, "max_message_id_bytes"),
        TextLimit(compactions, "from_message_id", ids, "max_message_id_bytes"),
        TextLimit(compactions, "to_message_id", ids, "max_message_id_bytes"),
        TextLimit(compactions, "summary", limits.max_summary_bytes, "max_summary_bytes"),
        TextLimit("cf_agents_session_attachment_meta", "media_type", MAX_MEDIA_TYPE_BYTES, "max_media_type_bytes"),
    )


def stored_read_back(limits: Limits) -> ReadBack:
    """How large a message a file brought in from elsewhere may hold, read back with its
    attachments inline: as the write calls bound one (`max_assembly_bytes`)."""
    return ReadBack(limits.max_assembly_bytes, restored_pointers)


RESPONSE_PAYLOAD_BYTES = 3 * 1024 * 1024
"""What one response carries at most of anything sized by its content (a piece of a message, a
frame of an export or an attachment, a batch's results): stock clients accept responses up to
4 MiB, and the rest is left to the response's other fields."""

MAX_BATCH_RESULT_BYTES = RESPONSE_PAYLOAD_BYTES
"""A batch's results (each message's id, parent id and role; its JSON is left out first) go back
in one response, which stock clients accept up to 4 MiB: a batch past this is refused unwritten.
Not a setting: it follows from that response limit, which no server flag can raise."""

MAX_DELETE_IDS_BYTES = RESPONSE_PAYLOAD_BYTES
"""A delete's ids, as passed, go to subscribers in one change event, one response of at most
4 MiB: a delete past this is refused unwritten (else no subscriber could receive its event)."""

ID_OVERHEAD_BYTES = 4
"""A repeated string's tag and length in a response, beside each id."""

RESULT_OVERHEAD_BYTES = 80
"""What one write result takes in a response beyond its id, parent id and role, JSON left out:
field tags and lengths, its numbers and flags (66 bytes at most)."""


def results_bytes(infos: Sequence[RowInfo | None], *, at_most: int) -> int:
    """An upper bound on the size of write results with these infos in a response, JSON left
    out. Four bytes a character bound it first; UTF-8 is measured only when that exceeds
    `at_most`, so a common batch costs one pass of `len`."""
    characters = sum(len(i.id) + len(i.parent_id or "") + len(i.role) for i in infos if i is not None)
    bound = 4 * characters + RESULT_OVERHEAD_BYTES * len(infos)
    if bound <= at_most:
        return bound
    return RESULT_OVERHEAD_BYTES * len(infos) + sum(
        utf8_length(i.id) + utf8_length(i.parent_id or "") + utf8_length(i.role) for i in infos if i is not None
    )


def check_size(value: str, limit: int, what: str, limit_name: str, field: str) -> None:
    """INVALID_ARGUMENT when a text is longer (UTF-8 bytes) than a limit."""
    if len(value) * 4 <= limit:
        return
    size = utf8_length(value)
    if size > limit:
        raise InvalidArgument(
            f"{what} is {size} bytes; the limit is {limit} bytes ({limit_name})",
            reason="LIMIT_EXCEEDED",
            field=field,
            limit=limit_name,
            limit_value=str(limit),
        )


def exceeded(what: str, limit_name: str, limit_value: int, unit: str = "") -> LimitExceeded:
    suffix = f" {unit}" if unit else ""
    return LimitExceeded(
        f"{what}: the limit is {limit_value}{suffix} ({limit_name})",
        limit=limit_name,
        limit_value=str(limit_value),
    )


def busy(message: str, limit_name: str, limit_value: int) -> LimitExceeded:
    """A refusal for now: others hold what `limit_name` bounds (clients retry SERVER_BUSY)."""
    return LimitExceeded(message, reason="SERVER_BUSY", limit=limit_name, limit_value=str(limit_value))


async def check_room(store: ObjectStore, adding: int, limit: int) -> None:
    """Refuses a write of about `adding` bytes to an object that holds `limit` bytes or would
    pass it. The files are measured first (cheap); only a file past the limit has its pages in
    use counted, as it keeps its size when deletes free them."""
    if store.cached_file_bytes() + adding <= limit:
        return
    in_use = await store.cached_bytes_in_use()
    if in_use + adding <= limit:
        return
    raise exceeded(
        f"the object is full ({in_use} bytes in use): delete messages or clear sessions to make room",
        "max_object_bytes",
        limit,
        "bytes",
    )


# Listings' pages (`page_size` 0 asks for the default, a larger one gets the maximum). A page
# is also cut where its response would pass a frame's budget.
COMPACTIONS_PAGE_DEFAULT, COMPACTIONS_PAGE_MAX = 100, 1_000
SESSIONS_PAGE_DEFAULT, SESSIONS_PAGE_MAX = 1_000, 10_000


def page_size(value: int, *, default: int, maximum: int) -> int:
    """A listing's page size as asked: 0 for `default`, at most `maximum`, never negative."""
    if value < 0:
        raise InvalidArgument(f"page_size must not be negative, not {value} (0 for {default})", field="page_size")
    return default if value == 0 else min(value, maximum)
