"""Which messages of an open object are known to be large, so that reading them by id skips the
quick path.

A read by id (`GetMessage`, or a window of up to 50 of `GetMessages`) is point reads, quick
enough to run in place on the event loop (storage's quick reads), unless a message is
megabytes: continuation rows, or attachment payloads restored into it. Such a read would run in
place until its time there runs out, then again on a worker thread. Telling the two apart from
storage costs as much as the read (the row's continuation count lies after its content, and
SQLite loads a large row whole to compare its key), so the open object remembers what its
writes and reads have shown: large rows written since it opened, and large messages read. An id
it does not know is read quickly (a read that outlasts its time in place runs again on a worker
thread) and learnt from its size. A stale entry (the message since replaced or deleted) costs a
read on a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sessions_server.storage.rows import NewRow
from sessions_server.storage.store import ObjectStore

MEMO_KEY: Final = "large-messages"
# A message read whole longer than this (in characters) is remembered: every message with
# continuation rows is (a row holds 1.5 MiB of UTF-8, at most 4 bytes a character), and reading
# a quarter of a megabyte takes a fraction of a millisecond, so little is lost by sending it to a
# worker thread too.
LARGE_CHARS: Final = 1 << 18
# Entries are of large messages only, but messages with attachments count too, and a
# conversation may have many; past this the object stops learning. An entry is a hash of the
# (session id, message id) pair, not the pair: ids may be 16 KiB each, and 4,096 pairs of such
# ids held 66 MiB per open object. Two pairs sharing a hash cost one read on a worker thread.
MAX_REMEMBERED: Final = 4096


def _entry(session_id: str, message_id: str) -> int:
    return hash((session_id, message_id))


def any_known_large(store: ObjectStore, session_id: str, message_ids: Iterable[str]) -> bool:
    known = store.memo.get(MEMO_KEY)
    return known is not None and any(_entry(session_id, message_id) in known for message_id in message_ids)


def note_read(store: ObjectStore, session_id: str, message_id: str, json_chars: int) -> None:
    """After a message was read whole: remembers it if it was large."""
    if json_chars > LARGE_CHARS:
        _remember(store, session_id, message_id)


def note_written(store: ObjectStore, session_id: str, rows: Iterable[NewRow | None]) -> None:
    """After rows were written: remembers those with continuation rows or attachment references."""
    for row in rows:
        if row is not None and (len(row.slices) > 1 or row.references):
            _remember(store, session_id, row.id)


def _remember(store: ObjectStore, session_id: str, message_id: str) -> None:
    known: set[int] = store.memo.setdefault(MEMO_KEY, set())
    if len(known) < MAX_REMEMBERED:
        known.add(_entry(session_id, message_id))
