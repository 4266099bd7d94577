"""Packed responses of remembered reads, kept to be sent again as they are.

An agent reads its whole history after nearly every append. The domain hands the transport the
same remembered message views each time, and the transport keeps, per packed response, the
bytes it sent: the next read finds a response by its first view and sends it again after
checking that its last view sits where it belongs in the new read. Per message, a repeated read
then does nothing at all, which is what keeps its cost from growing with the transcript.

A kept response holds its first and last views, so neither can be freed and its key (the first
view's id) cannot be reused by another view while the entry lives. Views are never changed
once built; a changed message comes as a new view, whose id finds nothing here. An update
replaces one remembered view and leaves the views around it: every remembered view of the
session shares a count of such rewrites (`MessageView.rewrites`), and a response kept at an
older count is packed again; nor is a response kept if a view in it was replaced by then
(`MessageView.superseded`: a read may hold a window taken before an update). Only responses
built entirely from views encoded before (remembered ones) are kept, and only those closed by a
limit, not by the end of a read, so an append does not leave a trail of ever-longer tails.
Bounded for the whole process: MAX_PACKED_BYTES (the responses and the views they hold), least
recently used first out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from sessions_server.domain.views import MessageView

# The command line sets a third of --message-memo-bytes; this is that third of its default.
MAX_PACKED_BYTES = 32 * 1024 * 1024
# What an entry costs beyond its bytes: the entry, the dictionary slot.
ENTRY_OVERHEAD_BYTES = 200


@dataclass(slots=True, eq=False)
class PackedResponse:
    """One packed response: `count` frames from `first` to `last`, for `max_messages` per
    response and the response type whose frames field has wire tag `tag`; built, of views none
    of which was superseded, when its first view's session had seen `rewrites` rewrites."""

    first: MessageView
    last: MessageView
    count: int
    max_messages: int
    tag: bytes
    data: bytes
    rewrites: int = -1  # the first view's session's rewrite count when packed (-1: none)

    def __post_init__(self) -> None:
        if self.first.rewrites is not None:
            self.rewrites = self.first.rewrites.count


_lock = threading.Lock()  # one server per process has one loop; tests run several servers
# By id(first), least recently used first; each with the cost it was counted at.
_kept: OrderedDict[int, tuple[PackedResponse, int]] = OrderedDict()
_kept_bytes = 0


def starting_at(view: MessageView, max_messages: int, tag: bytes) -> PackedResponse | None:
    """The kept response that begins with `view`, for these packing parameters."""
    with _lock:
        kept = _matching(view, max_messages, tag)
        if kept is not None:
            _kept.move_to_end(id(view))
        return kept


def begins_at(view: MessageView, max_messages: int, tag: bytes) -> bool:
    """Whether a kept response begins with `view` (a look that does not count as a use)."""
    with _lock:
        return _matching(view, max_messages, tag) is not None


def keep(response: PackedResponse) -> None:
    """Keeps `response` (replacing what began with the same view) within the budget."""
    global _kept_bytes
    with _lock:
        _forget(id(response.first))
        cost = _cost(response)
        if cost > MAX_PACKED_BYTES:
            return
        _kept[id(response.first)] = (response, cost)
        _kept_bytes += cost
        _evict()


def set_budget(total_bytes: int) -> None:
    """Sets MAX_PACKED_BYTES (0 keeps nothing) and drops what no longer fits."""
    global MAX_PACKED_BYTES
    with _lock:
        MAX_PACKED_BYTES = max(0, total_bytes)
        _evict()


def kept_bytes() -> int:
    return _kept_bytes


def kept_responses() -> list[PackedResponse]:
    """The kept responses, least recently used first."""
    with _lock:
        return [response for response, _ in _kept.values()]


def _matching(view: MessageView, max_messages: int, tag: bytes) -> PackedResponse | None:
    entry = _kept.get(id(view))
    if entry is None:
        return None
    kept = entry[0]
    if kept.first is not view or kept.max_messages != max_messages or kept.tag != tag:
        return None
    if view.rewrites is None or view.rewrites.count != kept.rewrites:
        return None  # packed before a message of its session was rewritten, or never remembered
    return kept


def _cost(response: PackedResponse) -> int:
    """Its bytes, and the two views it holds alive (counted in full: the memo may drop them)."""
    views = (response.first,) if response.last is response.first else (response.first, response.last)
    held = sum(len(view.json) + len(view.encoded or b"") for view in views)
    return len(response.data) + held + ENTRY_OVERHEAD_BYTES


def _evict() -> None:
    """Drops the least recently used responses until the rest fit MAX_PACKED_BYTES."""
    while _kept_bytes > MAX_PACKED_BYTES and _kept:
        _forget(next(iter(_kept)))


def _forget(key: int) -> None:
    global _kept_bytes
    dropped = _kept.pop(key, None)
    if dropped is not None:
        _kept_bytes -= dropped[1]
