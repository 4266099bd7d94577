"""Messages as reads and writes answer with them: stored rows made readable.

A stored row becomes a view with its attachment payloads put back (inline readers) or left as
pointers; rows upstream's reads skip (unparseable) become none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sessions_server.domain import attachments, jsjson, messages
from sessions_server.storage import queries
from sessions_server.storage.queries import Connection
from sessions_server.storage.rows import NewRow, RowInfo, StoredMessage


@dataclass(slots=True, eq=False)
class Rewrites:
    """How many times a message of the views remembered together (one session's) was rewritten
    in place. Something built of several of those views (the transport's packed responses) is
    good only while this has not moved: a rewritten message comes as a new view, but the views
    around it stay the same objects."""

    count: int = 0


@dataclass(slots=True)  # not frozen: built per message on every read, and frozen init costs 5x
class MessageView:
    """A message as a read or write returns it: lifted facts (None for synthetic ones) and JSON."""

    info: RowInfo | None
    json: str
    overlay: bool = False  # a synthetic compaction overlay (its info names id and role only)
    # The transport's encoding of this view, kept on it: views remembered by the path memo are
    # shared by every read of the session, so each is encoded once.
    encoded: bytes | None = None
    # Set when the path memo remembers the view: its session's rewrites.
    rewrites: Rewrites | None = None
    # Replaced by an update's view: nothing that joins it to other views may be kept.
    superseded: bool = False


def stored_row_ok(stored: StoredMessage) -> bool:
    return stored.stamped or messages.is_stored_message(stored.content)


def view_of(conn: Connection, stored: StoredMessage | None, inline: bool) -> MessageView | None:
    """The readable form of a stored row, attachment payloads restored when `inline`; None for
    rows upstream's reads skip (unparseable). Runs on the read connection's thread."""
    if stored is None or not stored_row_ok(stored):
        return None
    if inline and attachments.may_hold_pointers(stored.content):
        try:
            message = jsjson.parse(stored.content)
        except jsjson.JsonInputError:  # nested deeper than reads parse: skipped, as the unparseable
            return None
        resolved = attachments.resolve(message, lambda digest: queries.load_payload(conn, digest))
        if resolved is not message:
            return MessageView(stored.info, jsjson.stringify(resolved))
    return MessageView(stored.info, stored.content)


def as_read_inline(conn: Connection, json_text: str, row: NewRow) -> str:
    """A message just written as an inline read gives it: the payloads of the pointers its
    writer sent (copied from a POINTER read, say) put back, those the object holds. A change
    event carries it so to INLINE subscribers (who got the bare pointers). Media sent inline is
    in `json_text` already: a message without references costs nothing here."""
    if not row.references or not attachments.may_hold_pointers(json_text):
        return json_text
    message = jsjson.parse(json_text)
    resolved = attachments.resolve(message, lambda digest: queries.load_payload(conn, digest))
    return json_text if resolved is message else jsjson.stringify(resolved)


def views_by_id(
    conn: Connection,
    session_id: str,
    ids: Sequence[str],
    inline: bool,
    max_bytes: int,
    as_stored: list[MessageView] | None = None,
) -> tuple[dict[str, MessageView], int]:
    """One hydration window: the rows by id (one query, plus one for continuations), as views,
    and how many of `ids` (from the first) they answer. The views stop after the one whose JSON
    passes `max_bytes` in all: a window is sized by stored bytes before it is read, and a
    payload named many times is stored once but read back at each place. Views that are the
    stored JSON as is (the same in every attachment mode) are also added to `as_stored` when
    given."""
    found = queries.get_messages(conn, session_id, ids)
    views = {}
    held = 0
    for answered, message_id in enumerate(ids, 1):
        stored = found.get(message_id)
        if stored is None or message_id in views:
            continue
        view: MessageView | None
        if stored.stamped and not attachments.may_hold_pointers(stored.content):
            view = MessageView(stored.info, stored.content)  # the common row
            if as_stored is not None:
                as_stored.append(view)
        else:
            view = view_of(conn, stored, inline)
            if view is None:
                continue
        views[message_id] = view
        held += len(view.json)
        if held > max_bytes:
            return views, answered
    return views, len(ids)


def pointer_form(message_json: str) -> str:
    """A message's JSON with inline media as attachment pointers (for pointer-mode readers)."""
    if "base64" not in message_json and '"data"' not in message_json:
        return message_json
    message = jsjson.parse(message_json)
    extracted = attachments.extract(message).message
    return message_json if extracted is message else jsjson.stringify(extracted)
