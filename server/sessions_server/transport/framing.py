"""Framing of large payloads: no response frame exceeds 4 MiB.

A message whose JSON fits in one piece travels as one MessageFrame (so grpcurl output stays
simple); a larger one is cut on UTF-8 boundaries into consecutive pieces that clients join.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.domain.service import MessageView
from sessions_server.storage.rows import RowInfo

# Leaves room under the 4 MiB default receive limit for the frame's other fields.
PIECE_BYTES = 3 * 1024 * 1024


def info_message(info: RowInfo) -> pb.MessageInfo:
    out = pb.MessageInfo(
        id=info.id,
        role=info.role,
        seq=info.seq,
        created_at_ms=info.created_at_ms,
        token_estimate=info.token_estimate,
    )
    if info.parent_id is not None:
        out.parent_id = info.parent_id
    return out


def split_utf8(text: str, piece_bytes: int = PIECE_BYTES) -> Iterator[str]:
    """Cuts text into pieces of at most `piece_bytes` UTF-8 bytes, never inside a character."""
    if len(text) * 4 <= piece_bytes:
        yield text
        return
    data = text.encode("utf-8", "surrogatepass")
    start = 0
    while start < len(data):
        end = min(start + piece_bytes, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        yield data[start:end].decode("utf-8", "surrogatepass")
        start = end


def message_frames(view: MessageView, *, with_info: bool = True) -> Iterator[pb.MessageFrame]:
    """The frames of one message: info on the first, `more_pieces` on all but the last."""
    pieces = list(split_utf8(view.json))
    for index, piece in enumerate(pieces):
        frame = pb.MessageFrame(json=piece, more_pieces=index < len(pieces) - 1)
        if index == 0 and with_info:
            frame.info.CopyFrom(_info_for(view))
        yield frame


def _info_for(view: MessageView) -> pb.MessageInfo:
    # A refused overlay write has no row: its info is empty. Overlays name their id and role.
    if view.info is None:
        return pb.MessageInfo()
    if view.overlay:
        return pb.MessageInfo(id=view.info.id, role=view.info.role, overlay=True)
    return info_message(view.info)


def json_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class ResponseBudget:
    """Bytes of message JSON one response may still carry; what does not fit is omitted and
    read back by the client, so no response exceeds the 4 MiB frame limit."""

    def __init__(self, limit_bytes: int = PIECE_BYTES) -> None:
        self.remaining = limit_bytes

    def take(self, size: int) -> bool:
        if size > self.remaining:
            return False
        self.remaining -= size
        return True


def written_message(view: MessageView, budget: ResponseBudget | None = None) -> pb.WrittenMessage:
    """A write's stored message: inline when it fits the response, else omitted (read it back)."""
    out = pb.WrittenMessage()
    out.info.CopyFrom(_info_for(view))
    if (budget or ResponseBudget()).take(json_bytes(view.json)):
        out.json = view.json
    else:
        out.json_omitted = True
    return out


# A packed response stops adding whole messages past this many bytes of JSON; big messages still
# travel as pieces of at most PIECE_BYTES, each in a response of its own.
PACK_BYTES = 1024 * 1024


async def packed_frames(
    items: AsyncIterator[tuple[MessageView, bool]], max_messages: int
) -> AsyncIterator[tuple[list[pb.MessageFrame], bool]]:
    """Groups messages into responses of up to `max_messages` frames and PACK_BYTES of JSON. A
    response is sent as soon as the source would have to wait (so the first message of a read is
    never held back for a full pack), and a message ending a batch ends its response. Yields
    (frames, batch_end)."""
    frames: list[pb.MessageFrame] = []
    used = count = 0
    pending: asyncio.Future[tuple[MessageView, bool]] | None = asyncio.ensure_future(anext(items))
    while pending is not None:
        if frames and not pending.done():
            await asyncio.sleep(0)  # let an in-memory next item arrive without waiting on I/O
            if not pending.done():
                yield frames, False
                frames, used, count = [], 0, 0
        try:
            view, batch_end = await pending
        except StopAsyncIteration:
            break
        pending = asyncio.ensure_future(anext(items))
        size = json_bytes(view.json)
        if frames and (count >= max_messages or used + size > PACK_BYTES):
            yield frames, False
            frames, used, count = [], 0, 0
        pieces = list(message_frames(view))
        if len(pieces) > 1:
            if frames:
                yield frames, False
                frames, used, count = [], 0, 0
            for index, piece in enumerate(pieces):
                yield [piece], batch_end and index == len(pieces) - 1
            continue
        frames.extend(pieces)
        used += size
        count += 1
        if batch_end:
            yield frames, True
            frames, used, count = [], 0, 0
    if pending is not None and not pending.done():
        pending.cancel()
    if frames:
        yield frames, False
