"""Framing of large payloads: no response frame exceeds 4 MiB.

A message whose JSON fits in one piece travels as one MessageFrame (so grpcurl output stays
simple); a larger one is cut on UTF-8 boundaries into consecutive pieces that clients join.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.domain.chunking import utf8_length
from sessions_server.domain.limits import RESPONSE_PAYLOAD_BYTES, results_bytes
from sessions_server.domain.records import Compaction
from sessions_server.domain.search import SearchHit
from sessions_server.domain.service import AppendResult
from sessions_server.domain.views import MessageView
from sessions_server.transport import packed_cache

# The largest response the server sends: gRPC's default receive limit, which stock clients keep.
RESPONSE_LIMIT_BYTES = 4 * 1024 * 1024
PIECE_BYTES = RESPONSE_PAYLOAD_BYTES

Resp = TypeVar("Resp")


def split_utf8(text: str, piece_bytes: int = PIECE_BYTES) -> Iterator[str]:
    """Cuts text into pieces of at most `piece_bytes` UTF-8 bytes, never inside a character."""
    if piece_bytes < 4:  # a piece must hold the widest character, or the cut could not advance
        raise ValueError(f"piece_bytes must be at least 4, got {piece_bytes}")
    if len(text) * 4 <= piece_bytes:
        yield text
        return
    if text.isascii():  # a character is a byte: cut the text itself, no encoded copy
        for start in range(0, len(text), piece_bytes):
            yield text[start : start + piece_bytes]
        return
    data = text.encode("utf-8", "surrogatepass")
    for start, end in _utf8_cuts(data, piece_bytes):
        yield data[start:end].decode("utf-8", "surrogatepass")


def _utf8_cuts(data: bytes, piece_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive pieces of UTF-8 `data`, each at most `piece_bytes` long and
    ending on a character boundary (`piece_bytes` is at least 4, the widest character)."""
    start = 0
    while start < len(data):
        end = min(start + piece_bytes, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        yield start, end
        start = end


def message_frames(view: MessageView) -> Iterator[pb.MessageFrame]:
    """The frames of one message as objects (a change event nests them in its response): info on
    the first, `more_pieces` on all but the last. Responses of reads are `message_responses`."""
    pieces = list(split_utf8(view.json))
    for index, piece in enumerate(pieces):
        frame = pb.MessageFrame(json=piece, more_pieces=index < len(pieces) - 1)
        if index == 0:
            _fill_info(frame.info, view)
        yield frame


def message_responses(view: MessageView, response_class: Any) -> Iterator[bytes]:
    """A response type whose only field is `MessageFrame frame`, encoded here for one message:
    whole in one response (the view's kept frame encoding), or in pieces, one response each."""
    tag = _field_tag(response_class, "frame")
    size, data = _utf8_size(view.json)
    if size <= PIECE_BYTES:
        yield tag + encoded_frame(view)
    else:
        yield from _piece_responses(view, tag, data)


def _piece_responses(view: MessageView, tag: bytes, data: bytes | None = None) -> Iterator[bytes]:
    """One response per piece of the view's JSON, encoded from its UTF-8 bytes (`data`, when the
    caller has them): the frame field (`tag`) holding info on the first piece, the piece, and
    `more_pieces` on all but the last. A 5 MB message built through protobuf objects was copied
    three more times (set, nested, serialized) and checked for valid UTF-8 twice."""
    text = view.json
    cuts: Iterable[tuple[int, int]]
    if data is None and text.isascii():
        # A character is a byte: each piece is encoded as it goes, not the whole text at once
        # (a 100 MB message was held once more so, as its bytes, while its pieces went out).
        total = len(text)
        cuts = ((start, min(start + PIECE_BYTES, total)) for start in range(0, total, PIECE_BYTES))
        whole: str | memoryview = text
    else:
        if data is None:
            data = text.encode("utf-8")
        total = len(data)
        cuts = _utf8_cuts(data, PIECE_BYTES)
        whole = memoryview(data)
    info = pb.MessageInfo()
    _fill_info(info, view)
    head = info.SerializeToString()
    first = _FRAME_INFO_TAG + _varint(len(head)) + head
    for start, end in cuts:
        more = _MORE_PIECES if end < total else b""
        size = _varint(end - start)
        piece = whole[start:end]
        frame_bytes = len(first) + len(_FRAME_JSON_TAG) + len(size) + end - start + len(more)
        json_bytes = piece.encode("ascii") if isinstance(piece, str) else piece
        yield b"".join((tag, _varint(frame_bytes), first, _FRAME_JSON_TAG, size, json_bytes, more))
        first = b""


def _fill_info(target: pb.MessageInfo, view: MessageView) -> None:
    """Sets the info in place (assigning fields is several times cheaper than building a message
    and copying it, which counts at tens of thousands of frames a second)."""
    info = view.info
    if info is None:  # a refused overlay write has no row: its info is present and empty
        target.SetInParent()
        return
    target.id = info.id
    target.role = info.role
    if view.overlay:  # a synthetic overlay names its id and role only
        target.overlay = True
        return
    target.seq = info.seq
    target.created_at_ms = info.created_at_ms
    target.token_estimate = info.token_estimate
    if info.parent_id is not None:
        target.parent_id = info.parent_id


def json_bytes(text: str) -> int:
    return utf8_length(text)


def _utf8_size(text: str) -> tuple[int, bytes | None]:
    """`json_bytes`, with the UTF-8 bytes when finding the size took encoding them: a message
    over PIECE_BYTES is then cut from that one encoding."""
    if text.isascii():
        return len(text), None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: sized as before, and its encoding fails later as before
        return json_bytes(text), None
    return len(data), data


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


def written_message(
    view: MessageView, budget: ResponseBudget | None = None, sent: str | None = None, omit_as_sent: bool = False
) -> pb.WrittenMessage:
    """A write's stored message: inline when it fits the response, else omitted (read it back,
    unless it is `sent`, the JSON the request carried). `omit_as_sent`: the request asked to
    have JSON that is `sent` left out."""
    out = pb.WrittenMessage()
    _fill_info(out.info, view)
    if _json_inline(view, budget or ResponseBudget(), sent, omit_as_sent):
        out.json = view.json
    else:
        out.json_omitted = True
        out.json_as_sent = view.json == sent
    return out


def _json_inline(view: MessageView, budget: ResponseBudget, sent: str | None, omit_as_sent: bool) -> bool:
    """Whether a write's answer carries the stored JSON (taking its bytes from `budget`): not
    when the request asked to leave out JSON that is `sent`, nor past the budget."""
    return not (omit_as_sent and view.json == sent) and budget.take(json_bytes(view.json))


_ONE_BYTE = tuple(bytes((value,)) for value in range(0x80))

# A packed response stops adding whole messages past this many bytes of JSON; big messages still
# travel as pieces of at most PIECE_BYTES, each in a response of its own.
PACK_BYTES = 1024 * 1024


def _varint(value: int) -> bytes:
    # Lengths of whole messages and their frames nearly always fit one or two bytes.
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encoded_frame(view: MessageView) -> bytes:
    """The view as a whole-message MessageFrame, length-prefixed for a repeated field, kept on
    the view (views the domain remembers are read again and again)."""
    encoded = view.encoded
    if encoded is None:
        frame = pb.MessageFrame(json=view.json)
        _fill_info(frame.info, view)
        data = frame.SerializeToString()
        encoded = view.encoded = _varint(len(data)) + data
    return encoded


def encoded_append_result(
    result: AppendResult,
    budget: ResponseBudget,
    response_class: Any = pb.AppendResult,
    sent: str | None = None,
    omit_as_sent: bool = False,
) -> bytes:
    """`result` encoded as an AppendResult (or an AppendMessageResponse, whose fields are the
    same). A WrittenMessage with its JSON inline has the wire form of a whole-message
    MessageFrame, so the view's frame encoding serves, and is kept on the view for reads.
    `omit_as_sent`: the request asked to have JSON that is `sent` left out."""
    inserted_tag, message_tag = _append_tags(response_class)
    head = inserted_tag + b"\x01" if result.inserted else b""
    view = result.message
    if _json_inline(view, budget, sent, omit_as_sent):
        return head + message_tag + encoded_frame(view)
    omitted = pb.WrittenMessage(json_omitted=True, json_as_sent=view.json == sent)
    _fill_info(omitted.info, view)
    data = omitted.SerializeToString()
    return head + message_tag + _varint(len(data)) + data


def encoded_append_results(results: Iterable[AppendResult], sent: Iterable[str], omit_as_sent: bool = False) -> bytes:
    """An AppendMessagesResponse of `results`, encoded; JSON beyond one response's budget is
    omitted (read back by the client, unless it is the item's `sent` JSON), and so is JSON that
    is the item's `sent` JSON when the request asked for that (`omit_as_sent`)."""
    results = list(results)
    budget = ResponseBudget(_json_room(results))
    out: list[bytes] = []
    for result, text in zip(results, sent, strict=True):
        data = encoded_append_result(result, budget, sent=text, omit_as_sent=omit_as_sent)
        out += (_RESULTS_TAG, _varint(len(data)), data)
    return b"".join(out)


def _json_room(results: Sequence[AppendResult]) -> int:
    """The JSON a batch's response may carry inline: what the results' other fields leave of the
    response limit (the domain refuses a batch whose other fields alone would not fit)."""
    fixed = results_bytes([result.message.info for result in results], at_most=RESPONSE_LIMIT_BYTES - PIECE_BYTES)
    return max(0, min(PIECE_BYTES, RESPONSE_LIMIT_BYTES - fixed))


_APPEND_TAGS: dict[Any, tuple[bytes, bytes]] = {}
_RESULTS_TAG = _varint(pb.AppendMessagesResponse.DESCRIPTOR.fields_by_name["results"].number << 3 | 2)


def _append_tags(response_class: Any) -> tuple[bytes, bytes]:
    """The wire tags of a response type's `bool inserted` and `WrittenMessage message`."""
    tags = _APPEND_TAGS.get(response_class)
    if tags is None:
        fields = response_class.DESCRIPTOR.fields_by_name
        tags = _APPEND_TAGS[response_class] = (
            _varint(fields["inserted"].number << 3),
            _varint(fields["message"].number << 3 | 2),
        )
    return tags


_FIELD_TAGS: dict[tuple[Any, str], bytes] = {}
_FRAME_FIELDS = pb.MessageFrame.DESCRIPTOR.fields_by_name
_FRAME_INFO_TAG = _varint(_FRAME_FIELDS["info"].number << 3 | 2)
_FRAME_JSON_TAG = _varint(_FRAME_FIELDS["json"].number << 3 | 2)
_MORE_PIECES = _varint(_FRAME_FIELDS["more_pieces"].number << 3) + b"\x01"


def _field_tag(response_class: Any, name: str) -> bytes:
    """The wire tag of a response type's MessageFrame field `name` (`frame` or `frames`)."""
    tag = _FIELD_TAGS.get((response_class, name))
    if tag is None:
        number = response_class.DESCRIPTOR.fields_by_name[name].number
        tag = _FIELD_TAGS[response_class, name] = _varint(number << 3 | 2)
    return tag


def _frames_tag(response_class: Any) -> bytes:
    """The wire tag of a response type's `repeated MessageFrame frames`."""
    return _field_tag(response_class, "frames")


_BATCH_END = _varint(pb.StreamHistoryResponse.DESCRIPTOR.fields_by_name["batch_end"].number << 3) + b"\x01"


def with_batch_end(response: pb.StreamHistoryResponse | bytes) -> pb.StreamHistoryResponse | bytes:
    """`response` with `batch_end` set (an encoded response gets the field appended)."""
    if isinstance(response, bytes):
        return response + _BATCH_END
    response.batch_end = True
    return response


def window_responses(
    views: Sequence[MessageView], max_messages: int, make: Callable[[], Resp]
) -> Iterator[Resp | bytes]:
    """`framed_responses` for a window with no batch ends. Packed, each response is first looked
    up among kept ones (packed_cache), else collected from the views' encodings (made for those
    that have none yet) and joined whole; a message that needs pieces goes alone, in pieces."""
    if max_messages <= 1:
        for response, _ in framed_responses([(view, False) for view in views], max_messages, make):
            yield response
        return
    tag = _frames_tag(make)
    start = 0
    while start < len(views):
        kept = packed_cache.starting_at(views[start], max_messages, tag)
        if kept is not None and start + kept.count <= len(views) and views[start + kept.count - 1] is kept.last:
            yield kept.data
            start += kept.count
            continue
        parts, end, keepable = _collect(views, start, max_messages, tag)
        if not parts:  # the message needs pieces
            for response, _ in framed_responses([(views[start], False)], max_messages, make):
                yield response
            start += 1
            continue
        data = tag.join([b"", *parts])  # the tag before each frame
        if keepable:
            packed_cache.keep(
                packed_cache.PackedResponse(views[start], views[end - 1], end - start, max_messages, tag, data)
            )
        yield data
        start = end


def _collect(views: Sequence[MessageView], start: int, max_messages: int, tag: bytes) -> tuple[list[bytes], int, bool]:
    """The encodings of the response that begins at `views[start]`, where it ends, and whether it
    may be kept: every view in it was encoded before (remembered) and none was rewritten since
    (superseded), and it ended at a limit, not at the end of the views or where a kept response
    begins (which a read that starts one row later, at the depth cap, meets before the limit)."""
    parts: list[bytes] = []
    used = 0
    remembered = True
    index = start
    stop = min(len(views), start + max_messages)
    while index < stop:
        view = views[index]
        if index > start and packed_cache.begins_at(view, max_messages, tag):
            return parts, index, False
        if view.superseded:  # rewritten since the read took it: a later read has the new one
            remembered = False
        encoded = view.encoded
        if encoded is None:
            if json_bytes(view.json) > PIECE_BYTES:
                return parts, index, remembered
            remembered = False
            encoded = encoded_frame(view)
        if parts and used + len(encoded) > PACK_BYTES:
            return parts, index, remembered
        parts.append(encoded)
        used += len(encoded)
        index += 1
    return parts, index, remembered and index - start == max_messages


def framed_responses(
    marked: Iterable[tuple[MessageView, bool]], max_messages: int, make: Callable[[], Resp]
) -> Iterator[tuple[Resp | bytes, bool]]:
    """Responses carrying the messages, with whether each ends a batch. With `max_messages` > 1
    a response packs up to that many messages and about PACK_BYTES of JSON (a message encoded
    before counts its encoding), and a message ending a batch ends its response; the response
    is encoded here from each view's encoded frame (`make` is then the response type, whose
    only field set is `frames`). Else each message has a `frame` of its own in a response from
    `make`. A message over PIECE_BYTES travels as consecutive pieces, one response each.
    Nothing is carried over between calls: the caller hands over what it has, and it all goes
    out."""
    packed = max_messages > 1
    tag = _frames_tag(make) if packed else b""
    parts: list[bytes] = []
    count = used = 0
    for view, batch_end in marked:
        encoded = view.encoded if packed else None
        if encoded is not None:  # framed before, so it fits in a piece; its encoding counts
            size = len(encoded)
        else:
            text = view.json
            size, data = _utf8_size(text)
            if size > PIECE_BYTES or not packed:
                if parts:
                    yield b"".join(parts), False
                    parts, count, used = [], 0, 0
                if size > PIECE_BYTES:
                    # One piece ahead, to mark the last, not all of them at once: they are as
                    # large as the message.
                    held: bytes | None = None
                    for piece in _piece_responses(view, tag if packed else _field_tag(make, "frame"), data):
                        if held is not None:
                            yield held, False
                        held = piece
                    if held is not None:
                        yield held, batch_end
                    continue
                single: Any = make()
                single.frame.json = text
                _fill_info(single.frame.info, view)
                yield single, batch_end
                continue
            encoded = encoded_frame(view)
        if parts and (count >= max_messages or used + size > PACK_BYTES):
            yield b"".join(parts), False
            parts, count, used = [], 0, 0
        parts.append(tag)
        parts.append(encoded)
        count += 1
        used += size
        if batch_end:
            yield b"".join(parts), True
            parts, count, used = [], 0, 0
    if parts:
        yield b"".join(parts), False


def search_responses(hits: Sequence[SearchHit], max_hits: int) -> Iterator[pb.SearchMessagesResponse]:
    """The responses of a search. With `max_hits` > 1 a response packs up to that many whole hits
    and about PACK_BYTES of text in `hits`; else each hit has a response of its own. A hit whose
    text is over PIECE_BYTES travels as consecutive pieces, one response each."""
    packed: pb.SearchMessagesResponse | None = None
    used = 0
    for hit in hits:
        size = json_bytes(hit.content)
        if max_hits > 1 and size <= PIECE_BYTES:
            if packed is not None and (len(packed.hits) >= max_hits or used + size > PACK_BYTES):
                yield packed
                packed = None
            if packed is None:
                packed, used = pb.SearchMessagesResponse(), 0
            packed.hits.add(id=hit.id, role=hit.role, session_id=hit.session_id, content=hit.content)
            used += size
            continue
        if packed is not None:
            yield packed
            packed = None
        pieces = [hit.content] if size <= PIECE_BYTES else list(split_utf8(hit.content))
        for index, piece in enumerate(pieces):
            response = pb.SearchMessagesResponse()
            target = response.hits.add() if max_hits > 1 else response
            target.content = piece
            target.more_pieces = index < len(pieces) - 1
            if index == 0:
                target.id, target.role, target.session_id = hit.id, hit.role, hit.session_id
            yield response
    if packed is not None:
        yield packed


def compaction_message(record: Compaction) -> pb.Compaction:
    return pb.Compaction(
        id=record.id,
        seq=record.seq,
        summary=record.summary,
        from_message_id=record.from_message_id,
        to_message_id=record.to_message_id,
        created_at_ms=record.created_at_ms,
    )
