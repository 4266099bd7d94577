"""Framing of large payloads: no response frame exceeds 4 MiB.

A message whose JSON fits in one piece travels as one MessageFrame (so grpcurl output stays
simple); a larger one is cut on UTF-8 boundaries into consecutive pieces that clients join.
"""

from __future__ import annotations

from collections.abc import Iterator

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
    # Synthetic messages (overlays, refused overlay writes) have no row: their info is empty.
    return pb.MessageInfo() if view.info is None else info_message(view.info)


def written_message(view: MessageView) -> pb.WrittenMessage:
    """A write's stored message: inline when it fits one frame, else omitted (read it back)."""
    out = pb.WrittenMessage()
    out.info.CopyFrom(_info_for(view))
    if len(view.json) * 4 <= PIECE_BYTES or len(view.json.encode("utf-8", "surrogatepass")) <= PIECE_BYTES:
        out.json = view.json
    else:
        out.json_omitted = True
    return out
