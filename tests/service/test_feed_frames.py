"""The change feed's shared encodings (transport.feed_frames.FeedFrames): an event is encoded once
per attachment mode for all its subscribers, and what is kept is bounded by bytes."""

from __future__ import annotations

from sessions_server.storage.feed import ChangeEvent
from sessions_server.storage.rows import RowInfo
from sessions_server.transport.feed_frames import FeedFrames, feed_responses


def _event(name: str, size: int) -> ChangeEvent:
    text = '{"id":"' + name + '","role":"user","parts":[{"type":"text","text":"' + "x" * size + '"}]}'
    return ChangeEvent("append", "", message_json=text, message_info=RowInfo(name, "user", None, 1, 0, 1))


def test_an_event_is_encoded_once_per_mode_and_the_kept_encodings_are_bounded() -> None:
    first = _event("a0", 10_000)
    shared = FeedFrames(max_bytes=3 * first.size)  # three such events
    inline = list(feed_responses(first, True, shared))
    assert list(feed_responses(first, True, shared)) == inline
    assert all(x is y for x, y in zip(feed_responses(first, True, shared), inline, strict=True))  # not re-encoded
    pointers = list(feed_responses(first, False, shared))
    assert pointers[0] is not inline[0]  # each mode its own

    later = [_event(f"b{index}", 10_000) for index in range(3)]
    for event in later:
        list(feed_responses(event, True, shared))
    assert shared.get(first, True) is None  # least recently used, dropped past the bound
    assert shared.get(later[-1], True) is not None
    assert len(shared._entries) == 3
