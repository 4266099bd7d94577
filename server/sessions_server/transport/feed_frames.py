"""The change feed's responses: each event encoded once, whoever it goes to (`FeedFrames`),
and framed in pieces when its message needs them (`feed_responses`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.domain.records import ChangeEvent, Reset
from sessions_server.domain.service import Progress
from sessions_server.domain.views import MessageView, pointer_form
from sessions_server.transport import framing

_CHANGE_TYPES = {
    "append": pb.CHANGE_TYPE_APPEND,
    "update": pb.CHANGE_TYPE_UPDATE,
    "delete": pb.CHANGE_TYPE_DELETE,
    "clear": pb.CHANGE_TYPE_CLEAR,
    "compact": pb.CHANGE_TYPE_COMPACT,
    "compaction": pb.CHANGE_TYPE_COMPACTION,
    "import": pb.CHANGE_TYPE_IMPORT,
    "compaction_error": pb.CHANGE_TYPE_COMPACTION_ERROR,
}
_PARENT_MODES = {"auto": pb.PARENT_MODE_AUTO, "root": pb.PARENT_MODE_ROOT, "id": pb.PARENT_MODE_ID}


FEED_FRAMES_BYTES = 16 * 1024 * 1024


class FeedFrames:
    """The encoded responses of recent change events, per attachment mode, shared by every
    subscriber they go to: an event is encoded once however many receive it. Bounded by the
    JSON the entries hold (`max_bytes`, least recently used dropped first): an event read again
    later (a resume replaying the retained ring) is encoded again. Each entry keeps its event
    alive, so no other event can take its identity, which keys it."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[int, bool], tuple[ChangeEvent, list[pb.SubscribeResponse]]] = OrderedDict()

    def get(self, event: ChangeEvent, inline: bool) -> list[pb.SubscribeResponse] | None:
        entry = self._entries.get((id(event), inline))
        if entry is None:
            return None
        self._entries.move_to_end((id(event), inline))
        return entry[1]

    def put(self, event: ChangeEvent, inline: bool, responses: list[pb.SubscribeResponse]) -> None:
        self._entries[(id(event), inline)] = (event, responses)
        self._bytes += event.size
        while self._bytes > self._max_bytes and len(self._entries) > 1:
            _, (dropped, _) = self._entries.popitem(last=False)
            self._bytes -= dropped.size


def feed_responses(
    item: ChangeEvent | Reset | Progress, inline: bool, shared: FeedFrames
) -> Iterator[pb.SubscribeResponse]:
    """The frames of one feed item: one, or several when its message needs pieces."""
    if isinstance(item, Progress):
        yield pb.SubscribeResponse(revision=item.revision, type=pb.CHANGE_TYPE_PROGRESS)
        return
    if isinstance(item, Reset):
        yield pb.SubscribeResponse(revision=item.revision, type=pb.CHANGE_TYPE_RESET, error=item.reason)
        return
    head = pb.SubscribeResponse(
        revision=item.revision,
        type=_CHANGE_TYPES[item.type],
        session_id=item.session_id,
        inserted=item.inserted,
        message_ids=item.message_ids,
        error=item.error,
    )
    if item.parent_kind:
        head.parent_mode = _PARENT_MODES[item.parent_kind]
        head.parent_id = item.parent_id
    if item.compaction is not None:
        head.compaction.CopyFrom(framing.compaction_message(item.compaction))
    if item.message_json is None:
        yield head
        return
    cached = shared.get(item, inline)
    if cached is None:
        text = item.message_json if inline else pointer_form(item.message_json)
        frames = list(framing.message_frames(MessageView(item.message_info, text)))
        head.message.CopyFrom(frames[0])
        cached = [head] + [
            pb.SubscribeResponse(revision=item.revision, type=head.type, session_id=item.session_id, message=frame)
            for frame in frames[1:]
        ]
        shared.put(item, inline, cached)
    yield from cached
