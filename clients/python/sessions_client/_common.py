"""What the sync and asyncio clients share: result types, request building, frame assembly,
and the one exception type raised for every failed call."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Final

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sessions_proto.v1 import sessions_pb2 as pb

Message = dict[str, Any]
OBJECT_KEY_HEADER: Final = "x-object-key"

# JavaScript's whitespace and line terminators (`String#trim`): upstream drops a summary that
# trims to nothing by these. Python's `str.strip` knows others (U+001C-U+001F, U+0085) and not
# U+FEFF.
JS_WHITESPACE: Final = (
    "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def is_blank(summary: str) -> bool:
    """Whether upstream's createCompactFunction would drop `summary` as empty."""
    return not summary.strip(JS_WHITESPACE)


def summary_of(answer: object) -> str:
    """What `compact`'s summarizer returned, which must be text: anything else is a TypeError
    that says so (it was an AttributeError of `strip`), as the TypeScript client's."""
    if not isinstance(answer, str):
        raise TypeError(f"summarize returned {type(answer).__name__}, not a string")
    return answer


# The C scanner `json.loads` runs, called without the wrappers around it (a decoder per call, two
# whitespace matches): the server writes compact JSON, and this halves the cost of decoding a
# read's small messages, which is most of a long history read's time in the client.
_scan_json: Final[Callable[[str, int], tuple[Any, int]]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads_message(text: str) -> Any:
    """`json.loads(text)`, the same value or the same error, faster for compact JSON, and for
    JSON nested as deep as the server stores it (`loads_json`)."""
    try:
        value, end = _scan_json(text, 0)
    except (StopIteration, RecursionError):  # no JSON at the start (json.loads says why), or deep
        return loads_json(text)
    return value if end == len(text) else loads_json(text)


# The server stores JSON nested up to 1,000 levels (upstream's bound, JS parses deeper), and
# Python's parser counts each level against the interpreter's recursion limit (1,000 by default,
# less the caller's own frames): a message nested 995 levels deep, which any writer may store,
# made every read of its session raise RecursionError here.
_NESTING_HEADROOM: Final = 1_100


_deep_parses = 0  # parses under way with the limit raised (the limit is the process's)
_limit_before = 0
_deep_parses_lock = threading.Lock()


def loads_json(text: str) -> Any:
    """`json.loads(text)`, given room for the deepest nesting the server stores. The limit is
    raised while any thread parses such a text, and put back when the last one is done: put
    back by one thread under another's parse, it failed that one."""
    global _deep_parses, _limit_before
    try:
        return json.loads(text)
    except RecursionError:
        pass
    with _deep_parses_lock:
        if _deep_parses == 0:
            _limit_before = sys.getrecursionlimit()
            sys.setrecursionlimit(_limit_before + _NESTING_HEADROOM)
        _deep_parses += 1
    try:
        return json.loads(text)
    finally:
        with _deep_parses_lock:
            _deep_parses -= 1
            if _deep_parses == 0:
                sys.setrecursionlimit(_limit_before)


# A request above this size goes through the client-streaming path, so any server or proxy
# with default 4 MiB limits accepts it. Pieces of a streamed message are this size too.
UNARY_LIMIT_BYTES: Final = 3 * 1024 * 1024
PIECE_BYTES: Final = 3 * 1024 * 1024
# Messages the server may pack into one response on long reads (one gRPC frame per message
# would otherwise dominate the cost of streaming history). The server reads at most 400 rows at
# a time and frames each read on its own, so asking for more changes nothing; asking for fewer
# splits its reads into more responses, at about 0.15 ms of server time each.
PACKED_MESSAGES: Final = 400
# An import sends messages of up to IMPORT_WHOLE_BYTES whole, packed into frames of about
# IMPORT_FRAME_BYTES of JSON (each frame costs the server a read of its own); larger ones in pieces.
IMPORT_WHOLE_BYTES: Final = 256 * 1024
IMPORT_FRAME_BYTES: Final = 1024 * 1024


def frames_of(response: Any) -> list[pb.MessageFrame]:
    """The MessageFrames of a read response: packed `frames`, or the single `frame`."""
    packed = getattr(response, "frames", None)  # only the long reads can pack
    if packed:
        return list(packed)
    return [response.frame] if response.HasField("frame") else []


class _Auto:
    """Sentinel: attach to the session's newest message."""

    _instance: _Auto | None = None

    def __new__(cls) -> _Auto:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "AUTO"


AUTO: Final = _Auto()
ParentArg = _Auto | str | None


class SessionsError(Exception):
    """A failed call: the gRPC status code, the server's message and its ErrorInfo reason."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str | None, metadata: Mapping[str, str]) -> None:
        super().__init__(f"{code.name}: {message}" + (f" [{reason}]" if reason else ""))
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata)

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> SessionsError:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        reason: str | None = None
        metadata: dict[str, str] = {}
        try:
            status = rpc_status.from_call(error)  # type: ignore[arg-type]
        except Exception:
            status = None
        if status is not None:
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    reason = info.reason
                    metadata = dict(info.metadata)
        if reason is None and ended_without_status(code, details or ""):
            return cls(grpc.StatusCode.UNAVAILABLE, f"{ENDED_WITHOUT_STATUS} ({details})", None, metadata)
        return cls(code, details or "", reason, metadata)


# A call's HTTP/2 stream that ended without gRPC's status (no trailers): a proxy in front of the
# server (HAProxy) ends a call so when its connection to the server fails under it. Whether the
# server carried the call out is unknown, as after any failed connection, and the clients report
# it alike: UNAVAILABLE without a reason (grpc-go and Connect report it as INTERNAL, gRPC core as
# UNKNOWN; the Go and TypeScript clients say what this one does).
ENDED_WITHOUT_STATUS: Final = (
    "the call ended without the server's status, as a proxy ends it when its connection to the server fails"
)


def ended_without_status(code: grpc.StatusCode, details: str) -> bool:
    """Whether gRPC core's status is its own for a stream that ended without trailers."""
    return code == grpc.StatusCode.UNKNOWN and details.startswith("Stream removed")


@dataclass(frozen=True)
class AppendResult:
    """An append's outcome: `inserted` is False when the id existed (then `message` is the stored
    one); `parent_id` is the parent actually used (None for a root). `message_json` is the stored
    message's JSON; `message` parses it when first read, so a caller who only checks `inserted`
    pays nothing for it (5 ms for a 5 MB message, a few microseconds per message of a batch)."""

    inserted: bool
    message_json: str = field(repr=False)
    parent_id: str | None

    @cached_property
    def message(self) -> Message:
        return loads_json(self.message_json)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class UpsertResult:
    """An upsert's outcome; `message` is parsed from `message_json` when first read."""

    inserted: bool
    changed: bool
    message_json: str = field(repr=False)

    @cached_property
    def message(self) -> Message:
        return loads_json(self.message_json)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RecentHistory:
    messages: list[Message]
    truncated: bool
    total_content_bytes: int


@dataclass(frozen=True)
class RowStat:
    id: str
    role: str
    bytes: int
    token_estimate: int


@dataclass(frozen=True)
class ImportItem:
    """One message to import verbatim, with its parent (None: a root) and created time."""

    message: Message | str
    parent_id: str | None
    created_at: int | datetime | None = None


@dataclass(frozen=True)
class ImportResult:
    imported: int
    skipped: int


@dataclass
class MessageWithInfo:
    """A decoded message and its lifted facts."""

    info: pb.MessageInfo
    json: str
    extra: dict[str, Any] = field(default_factory=dict)

    def message(self) -> Message:
        return loads_json(self.json)  # type: ignore[no-any-return]


# The most --max-object-key-bytes may be on any server, which makes room for headers carrying a
# key that long (percent-encoded, up to three times as long).
LARGEST_KEY_LIMIT_BYTES: Final = 64 * 1024


def routing_metadata(object_key: str, token: str | None = None) -> tuple[tuple[str, str], ...]:
    """The object key for routers (percent-encoded) and, when given, the bearer token."""
    _check_key_length(object_key)
    routing = (OBJECT_KEY_HEADER, urllib.parse.quote(object_key, safe=""))
    return (routing, ("authorization", f"Bearer {token}")) if token else (routing,)


def _check_key_length(object_key: str) -> None:
    """Refuses a key longer than any server takes, as a server refuses one past its own limit:
    its header would pass what the server takes, which gRPC refused in its own words
    (RESOURCE_EXHAUSTED "received metadata size exceeds hard limit"), the Go and TypeScript
    clients in theirs."""
    if len(object_key) * 4 <= LARGEST_KEY_LIMIT_BYTES:  # a code point is at most 4 bytes of UTF-8
        return
    size = len(object_key.encode("utf-8", "surrogatepass"))
    if size > LARGEST_KEY_LIMIT_BYTES:
        raise SessionsError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"object_key is {size} bytes; no server takes more than {LARGEST_KEY_LIMIT_BYTES} bytes (its "
            "--max-object-key-bytes at most)",
            "INVALID_OBJECT_KEY",
            {"field": "object_key"},
        )


@dataclass(frozen=True)
class TlsConfig:
    """TLS settings: the CA that signed the server's certificate (None: system roots) and, for
    mTLS, the client's certificate chain and key. All PEM bytes. A server run with
    --tls-client-ca that refuses the certificate, or its absence, closes the connection after the
    handshake, as a proxy ending TLS in front of an unreachable server does: tried again as any
    connection failure, the call then fails UNAVAILABLE saying "it may have refused the TLS
    handshake"."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def to_json(message: Message | str) -> str:
    """Messages may be given as dicts or as JSON text (sent byte for byte). Text holding a lone
    UTF-16 surrogate, which no UTF-8 request can carry, is refused before sending as the
    TypeScript and Go clients refuse it: SessionsError INVALID_ARGUMENT, reason INVALID_JSON
    (protobuf raised its own UnicodeEncodeError, naming its internals)."""
    if isinstance(message, str):
        if not message.isascii() and _LONE_SURROGATE.search(message) is not None:
            raise SessionsError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "message JSON holds a lone UTF-16 surrogate, which UTF-8 cannot carry; escape it as \\uXXXX",
                "INVALID_JSON",
                {},
            )
        return message
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone UTF-16 surrogate, as `json.loads` reads `"\ud800"` (which upstream stores):
            # no UTF-8 holds it, so the text goes with it escaped, as JSON allows.
            return json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text


def json_size(text: str) -> int:
    if len(text) * 4 <= UNARY_LIMIT_BYTES or text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def parent_fields(parent_id: ParentArg) -> dict[str, Any]:
    if parent_id is AUTO:
        return {"parent_mode": pb.PARENT_MODE_AUTO}
    if parent_id is None:
        return {"parent_mode": pb.PARENT_MODE_ROOT}
    if isinstance(parent_id, str):
        return {"parent_mode": pb.PARENT_MODE_ID, "parent_id": parent_id}
    raise TypeError("parent_id must be AUTO, None or a message id")


def source_value(source: str) -> pb.Source.ValueType:
    if source == "server":
        return pb.SOURCE_SERVER
    if source == "client":
        return pb.SOURCE_CLIENT
    raise ValueError('source must be "server" or "client"')


def created_at_ms(value: int | datetime | None) -> int:
    if value is None:
        return int(time.time() * 1000)
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def pieces(text: str) -> Iterator[str]:
    """Cuts JSON text into pieces of at most PIECE_BYTES UTF-8 bytes, on character boundaries."""
    if len(text) * 4 <= PIECE_BYTES:
        yield text
        return
    if text.isascii():  # a character is a byte: cut the text itself, no encoded copy
        for start in range(0, len(text), PIECE_BYTES):
            yield text[start : start + PIECE_BYTES]
        return
    data = text.encode("utf-8", "surrogatepass")
    start = 0
    while start < len(data):
        end = min(start + PIECE_BYTES, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        yield data[start:end].decode("utf-8", "surrogatepass")
        start = end


class FrameAssembler:
    """Joins MessageFrame pieces back into whole messages."""

    def __init__(self) -> None:
        self._info: pb.MessageInfo | None = None
        self._pieces: list[str] = []

    def feed(self, frame: pb.MessageFrame) -> MessageWithInfo | None:
        if self._info is None:
            self._info = frame.info
        self._pieces.append(frame.json)
        if frame.more_pieces:
            return None
        text = self._pieces[0] if len(self._pieces) == 1 else "".join(self._pieces)
        done = MessageWithInfo(self._info, text)
        self._info, self._pieces = None, []
        return done

    def finish(self) -> None:
        if self._pieces:
            raise SessionsError(grpc.StatusCode.DATA_LOSS, "stream ended inside a message", "INVALID_STREAM", {})


def history_request(
    object_key: str, session_id: str, leaf_id: str | None, newest_first: bool, pointers: bool, limit: int | None
) -> pb.StreamHistoryRequest:
    """A StreamHistory request as the clients send it: packed responses."""
    if limit is not None and not 0 < limit <= 0xFFFFFFFF:
        raise ValueError(f"limit must be a positive number of messages, got {limit}")
    return pb.StreamHistoryRequest(
        object_key=object_key,
        session_id=session_id,
        leaf_id=leaf_id or "",
        newest_first=newest_first,
        attachments=attachment_mode(pointers),
        max_messages_per_response=PACKED_MESSAGES,
        max_messages=limit or 0,
    )


class MessageDecoder:
    """Decodes the messages of a read's responses, joining pieces; for reads that return bare
    messages, so frame info is never looked at (it costs a wrapper per frame)."""

    def __init__(self) -> None:
        self._pieces: list[str] = []

    def messages(self, response: Any) -> list[Message]:
        out: list[Message] = []
        loads = loads_message
        for frame in response.frames or ([response.frame] if response.HasField("frame") else ()):
            text = frame.json
            if frame.more_pieces:
                self._pieces.append(text)
                continue
            if self._pieces:
                self._pieces.append(text)
                text, self._pieces = "".join(self._pieces), []
            out.append(loads(text))
        return out

    def finish(self) -> None:
        if self._pieces:
            raise SessionsError(grpc.StatusCode.DATA_LOSS, "stream ended inside a message", "INVALID_STREAM", {})


def import_frames(
    object_key: str, session_id: str, items: Iterable[ImportItem | Message]
) -> Iterator[pb.ImportMessagesRequest]:
    """ImportMessages frames. Items in hand (a list or tuple) are packed: messages of up to
    IMPORT_WHOLE_BYTES go whole (`ImportedMessage`), in frames of about IMPORT_FRAME_BYTES; a
    server older than that field reads none of them, which `import_result` reports. Items from
    an iterator go a message per frame, each as soon as the iterator yields it, as before. A
    message over IMPORT_WHOLE_BYTES goes in pieces either way. Plain messages chain: each one's
    parent is the previous message."""
    chain = _ImportFrames(object_key, session_id, pack=isinstance(items, Sequence))
    for item in items:
        yield from chain.frames_of(item)
    yield from chain.finish()


async def import_frames_async(
    object_key: str, session_id: str, items: AsyncIterable[ImportItem | Message]
) -> AsyncIterator[pb.ImportMessagesRequest]:
    """`import_frames` of an async iterable's items (another session's `history()`, say): a
    message a frame, each as soon as the iterable yields it."""
    chain = _ImportFrames(object_key, session_id, pack=False)
    async for item in items:
        for frame in chain.frames_of(item):
            yield frame
    for frame in chain.finish():
        yield frame


class _ImportFrames:
    """The frames of an import's items, one item at a time: the frame being packed, and the
    previous message's id, which a plain message's parent is."""

    def __init__(self, object_key: str, session_id: str, *, pack: bool) -> None:
        self._pack = pack
        self._previous: str | None = None
        self._frame = pb.ImportMessagesRequest(object_key=object_key, session_id=session_id)
        self._packed = 0
        self._sent = False

    def _next_frame(self) -> pb.ImportMessagesRequest:
        frame = self._frame
        self._frame, self._packed, self._sent = pb.ImportMessagesRequest(), 0, True
        return frame

    def frames_of(self, item: ImportItem | Message) -> Iterator[pb.ImportMessagesRequest]:
        if not isinstance(item, ImportItem):
            item = ImportItem(item, self._previous, None)
        text = to_json(item.message)
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if self._pack and size <= IMPORT_WHOLE_BYTES:
            if self._packed and self._packed + size > IMPORT_FRAME_BYTES:
                yield self._next_frame()
            whole = self._frame.messages.add(json=text, created_at_ms=created_at_ms(item.created_at))
            if item.parent_id is not None:
                whole.parent_id = item.parent_id
            self._packed += size
        else:
            if self._packed:  # whole messages first, in a frame of their own: no frame over ~4 MiB
                yield self._next_frame()
            parts = list(pieces(text))
            for index, piece in enumerate(parts):
                frame = self._frame
                frame.json_piece = piece
                frame.more_pieces = index < len(parts) - 1
                if index == 0:
                    frame.created_at_ms = created_at_ms(item.created_at)
                    if item.parent_id is not None:
                        frame.parent_id = item.parent_id
                yield self._next_frame()
        self._previous = _message_id(item.message)

    def finish(self) -> Iterator[pb.ImportMessagesRequest]:
        if self._packed or not self._sent:  # an empty import still names its object
            yield self._frame


class _FramesFailure:
    """What making a client stream's frames raised, kept to be raised as itself: gRPC reports it
    only as UNKNOWN "Exception iterating requests!", and grpc.aio cancels the call (a bare
    CancelledError)."""

    failure: Exception | None = None

    def raise_failure(self) -> None:
        """Raises what making a frame raised, if anything did (the call's failure followed)."""
        if self.failure is not None:
            self.failure.__suppress_context__ = True  # the call's own failure only says it ended
            raise self.failure


class SentFrames(_FramesFailure):
    """A client stream's frames, made from the caller's items as gRPC sends them; what making a
    frame raised (the caller's iterator failing, a message JSON cannot hold) is kept."""

    def __init__(self, frames: Iterator[Any]) -> None:
        self._frames = frames

    def __iter__(self) -> SentFrames:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._frames)
        except StopIteration:
            raise
        except Exception as exc:
            self.failure = exc
            raise


class SentFramesAsync(_FramesFailure):
    """`SentFrames` of frames made from an async iterable's items."""

    def __init__(self, frames: AsyncIterator[Any]) -> None:
        self._frames = frames

    def __aiter__(self) -> SentFramesAsync:
        return self

    async def __anext__(self) -> Any:
        try:
            return await anext(self._frames)
        except StopAsyncIteration:
            raise
        except Exception as exc:
            self.failure = exc
            raise


class FramesEachAttempt:
    """A client stream's frames made afresh for each attempt of its call (a call tried again
    sends them from the start): `make` is called once an attempt. What making the latest
    attempt's frames raised is raised as itself (`SentFrames`)."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self._make = make
        self._latest: SentFrames | None = None

    def __call__(self) -> SentFrames:
        self._latest = SentFrames(self._make())
        return self._latest

    def raise_failure(self) -> None:
        if self._latest is not None:
            self._latest.raise_failure()


def import_result(response: pb.ImportMessagesResponse, items: Iterable[ImportItem | Message]) -> ImportResult:
    """The response's counts; raises FAILED_PRECONDITION, as the Go and TypeScript clients do,
    when a packed import's counts miss messages (a server that predates packed frames reads only
    messages sent in pieces)."""
    result = ImportResult(int(response.imported_count), int(response.skipped_count))
    if isinstance(items, Sequence) and result.imported + result.skipped != len(items):
        raise SessionsError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the server accounted for {result.imported + result.skipped} of the {len(items)} messages sent: it "
            "does not read packed import frames (ImportedMessage); upgrade it, or pass the messages as an iterator",
            None,
            {},
        )
    return result


def _message_id(message: Message | str) -> str | None:
    if isinstance(message, str):
        try:
            value = loads_json(message)
        except ValueError:
            return None
        message = value if isinstance(value, dict) else {}
    ident = message.get("id") if isinstance(message, dict) else None
    return ident if isinstance(ident, str) else None


def upload_frames(header: pb.UploadHeader, text: str) -> Iterator[pb.UploadMessageRequest]:
    for index, piece in enumerate(pieces(text)):
        if index == 0:
            yield pb.UploadMessageRequest(header=header, json_piece=piece)
        else:
            yield pb.UploadMessageRequest(json_piece=piece)


def written_json_in_hand(written: pb.WrittenMessage, sent: str) -> str | None:
    """A write's stored JSON when the client holds it: from the response, or the JSON the call
    sent when the server says it stored exactly that (writes ask it to leave such JSON out).
    None: it must be read back."""
    if not written.json_omitted:
        return written.json
    return sent if written.json_as_sent else None


def parent_of(info: pb.MessageInfo) -> str | None:
    return info.parent_id if info.HasField("parent_id") else None


@dataclass(frozen=True)
class CompactionRecord:
    """A stored compaction overlay."""

    id: str
    seq: int
    summary: str
    from_message_id: str
    to_message_id: str
    created_at_ms: int

    @classmethod
    def of(cls, record: pb.Compaction) -> CompactionRecord:
        return cls(
            record.id,
            int(record.seq),
            record.summary,
            record.from_message_id,
            record.to_message_id,
            int(record.created_at_ms),
        )


@dataclass(frozen=True)
class CompactionPlan:
    from_message_id: str
    to_message_id: str
    prompt: str
    budget_tokens: int
    # Pass to add_compaction: the summary is then refused (SESSION_CHANGED) if its span was
    # edited since this plan. Each plan has its own, so it takes no part in equality.
    plan_token: str = field(default="", compare=False, repr=False)

    @classmethod
    def of(cls, response: pb.PlanCompactionResponse) -> CompactionPlan | None:
        if not response.planned:
            return None
        return cls(
            response.from_message_id,
            response.to_message_id,
            response.prompt,
            int(response.budget_tokens),
            response.plan_token,
        )


COMPACT_ATTEMPTS: Final = 3
"""How many times compact(summarize) plans and summarizes when its summary is refused."""
PLAN_AGAIN_REASONS: Final = frozenset({"SESSION_CHANGED", "PLAN_EXPIRED"})
"""Refusals of a summary that a new plan and summary can get past."""


def summary_refused(error: SessionsError, attempt: int) -> bool:
    """Whether compact(summarize) plans and summarizes again after `error` on try `attempt` (0 on)."""
    return error.reason in PLAN_AGAIN_REASONS and attempt + 1 < COMPACT_ATTEMPTS


@dataclass(frozen=True)
class CompactionPolicy:
    threshold_tokens: int = 0
    keep_recent_tokens: int = 0


@dataclass(frozen=True)
class SearchResult:
    id: str
    role: str
    content: str
    session_id: str


@dataclass(frozen=True)
class Attachment:
    hash: str
    media_type: str
    data: bytes


@dataclass(frozen=True)
class ObjectStats:
    file_bytes: int
    message_rows: int
    continuation_rows: int
    attachment_count: int
    attachment_bytes: int
    row_writes: int
    session_count: int
    free_bytes: int


@dataclass(frozen=True)
class VacuumReport:
    """What `vacuum()` did: the object's file and WAL in bytes before and after."""

    file_bytes_before: int
    file_bytes_after: int


@dataclass(frozen=True)
class ChangeEvent:
    """One change-feed event. `type` is upstream's event name ("append", "update", "delete",
    "clear", "compact", "compaction", "import"), or "compaction_error", or "reset" (events were
    missed: re-read state). `parent_id` for append is the option as passed (AUTO, None or an id)."""

    revision: int
    type: str
    session_id: str
    message: Message | None = None
    inserted: bool = False
    parent_id: Any = None
    message_ids: tuple[str, ...] = ()
    compaction: CompactionRecord | None = None
    error: str = ""


CHANGE_TYPE_NAMES: Final = {
    pb.CHANGE_TYPE_APPEND: "append",
    pb.CHANGE_TYPE_UPDATE: "update",
    pb.CHANGE_TYPE_DELETE: "delete",
    pb.CHANGE_TYPE_CLEAR: "clear",
    pb.CHANGE_TYPE_COMPACT: "compact",
    pb.CHANGE_TYPE_COMPACTION: "compaction",
    pb.CHANGE_TYPE_IMPORT: "import",
    pb.CHANGE_TYPE_COMPACTION_ERROR: "compaction_error",
    pb.CHANGE_TYPE_RESET: "reset",
    pb.CHANGE_TYPE_PROGRESS: "progress",
}


class EventAssembler:
    """Joins Subscribe frames into ChangeEvents (a large message spans several frames)."""

    def __init__(self) -> None:
        self._head: pb.SubscribeResponse | None = None
        self._messages = FrameAssembler()

    def feed(self, response: pb.SubscribeResponse) -> ChangeEvent | None:
        if self._head is None:
            self._head = response
        message: Message | None = None
        if response.HasField("message"):
            done = self._messages.feed(response.message)
            if done is None:
                return None
            message = done.message()
        head, self._head = self._head, None
        parent: Any = None
        if head.parent_mode == pb.PARENT_MODE_AUTO:
            parent = AUTO
        elif head.parent_mode == pb.PARENT_MODE_ID:
            parent = head.parent_id
        return ChangeEvent(
            revision=int(head.revision),
            type=CHANGE_TYPE_NAMES.get(head.type, "unknown"),
            session_id=head.session_id,
            message=message,
            inserted=head.inserted,
            parent_id=parent,
            message_ids=tuple(head.message_ids),
            compaction=CompactionRecord.of(head.compaction) if head.HasField("compaction") else None,
            error=head.error,
        )


def attachment_mode(pointers: bool) -> pb.AttachmentMode.ValueType:
    return pb.ATTACHMENT_MODE_POINTER if pointers else pb.ATTACHMENT_MODE_INLINE


KEEPALIVE_SECONDS: Final = 30.0
KEEPALIVE_TIMEOUT_SECONDS: Final = 10.0
# gRPC waits up to 120 s between attempts to reconnect, its wait growing while the server is
# away: after a 70 s outage a client's calls failed for 29 s more once the server was back, past
# any retry policy. Capped within the default policy's attempts (9 s, 4.6 s at the shortest
# jitter), gRPC's own jitter of 20% included.
MAX_RECONNECT_BACKOFF_MS: Final = 3_000


def channel_options(
    options: Sequence[tuple[str, Any]], keepalive_seconds: float | None, keepalive_timeout_seconds: float
) -> list[tuple[str, Any]]:
    """A channel's options: keepalive pings while calls are open, reconnection attempts at most
    MAX_RECONNECT_BACKOFF_MS apart, then the caller's `options`, which win. Without pings, a
    stream whose server or network vanished without closing the connection (a Subscribe waiting
    for its next event, say) waits forever: the client sends nothing on it that could fail. With
    them it fails UNAVAILABLE, and a subscription resumes."""
    chosen: dict[str, Any] = {"grpc.max_reconnect_backoff_ms": MAX_RECONNECT_BACKOFF_MS}
    if keepalive_seconds is not None:
        timeout_ms = round(keepalive_timeout_seconds * 1000)
        chosen["grpc.keepalive_time_ms"] = round(keepalive_seconds * 1000)
        chosen["grpc.keepalive_timeout_ms"] = timeout_ms
        chosen["grpc.http2.ping_timeout_ms"] = timeout_ms  # grpc 1.85 waits for a keepalive ping this long
        chosen["grpc.http2.max_pings_without_data"] = 0  # a server stream sends the server nothing
    chosen.update(options)
    return list(chosen.items())


class Connection:
    """Whether a client's connection was closed, shared by the client and its views
    (`with_options`): calls made after, and streams cut by, the close raise `closed_error()`
    instead of gRPC's own exceptions (ValueError, UsageError, a bare CancelledError). A close
    also ends the waits before calls go again (`pause`, `pause_async`): a call waiting out a
    backoff of seconds then raises at once, as one made after the close does."""

    __slots__ = ("_async_waits", "_closing", "closed")

    def __init__(self) -> None:
        self.closed = False
        self._closing = threading.Event()
        self._async_waits: set[asyncio.Future[None]] = set()

    def close(self) -> None:
        self.closed = True
        self._closing.set()
        for waiter in list(self._async_waits):
            with contextlib.suppress(RuntimeError):  # its loop closed: nothing waits there any more
                waiter.get_loop().call_soon_threadsafe(_end_wait, waiter)

    def pause(self, seconds: float) -> None:
        """Waits `seconds`, or until the close."""
        self._closing.wait(seconds)

    async def pause_async(self, seconds: float) -> None:
        """Waits `seconds`, or until the close (asyncio)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._async_waits.add(waiter)  # before the look at `closed`: a close between is not missed
        timer = loop.call_later(seconds, _end_wait, waiter)
        try:
            if not self.closed:
                await waiter
        finally:
            timer.cancel()
            self._async_waits.discard(waiter)


def _end_wait(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ClientClosed(SessionsError):
    """The client's own close ended the call (CANCELLED): never tried again, unlike a call the
    server or a proxy cut with CANCELLED."""


def closed_error() -> SessionsError:
    return ClientClosed(grpc.StatusCode.CANCELLED, "the client is closed", None, {})


def channel_closed_error() -> SessionsError:
    """A channel passed to the client, closed by its owner: gRPC refuses to call through it
    (ValueError, or asyncio's UsageError)."""
    return ClientClosed(grpc.StatusCode.CANCELLED, "the channel the client calls through is closed", None, {})


class Mirror:
    """A local list of one session's messages kept in sync by change events (upstream's
    `session.mirror()`): inserted appends replace-or-push, updates replace cached entries,
    deletes filter, clear empties; import/compact/compaction are ignored. A `reset` re-reads the
    history through `reload`. `revision`: the feed revision the list is current at, where a
    subscription resumes (`resume_from`) to keep it in sync. The first events after it may be
    ones the list already reflects (written before its read); applied in order, they bring it
    to the same list."""

    def __init__(self, session_id: str, reload: Any, revision: int = 0) -> None:
        self.session_id = session_id
        self.messages: list[Message] = []
        self.revision = revision
        self._reload = reload

    def apply(self, event: ChangeEvent) -> None:
        if self._follow(event):
            self.messages = list(self._reload())

    def _follow(self, event: ChangeEvent) -> bool:
        """Applies one event to the list; True for a reset (the list must be read again)."""
        if event.type == "reset":
            # The feed's revision now, lower than a resume point ahead of the feed: kept, that
            # point would have every later resume reset again.
            self.revision = event.revision
            return True
        self.revision = max(self.revision, event.revision)
        if event.session_id != self.session_id:
            return False
        if event.type == "append" and event.inserted and event.message is not None:
            ident = event.message.get("id")
            for index, cached in enumerate(self.messages):
                if cached.get("id") == ident:
                    self.messages[index] = event.message
                    return False
            self.messages.append(event.message)
        elif event.type == "update" and event.message is not None:
            ident = event.message.get("id")
            self.messages = [event.message if m.get("id") == ident else m for m in self.messages]
        elif event.type == "delete":
            doomed = set(event.message_ids)
            self.messages = [m for m in self.messages if m.get("id") not in doomed]
        elif event.type == "clear":
            self.messages = []
        return False


class AsyncMirror(Mirror):
    """`Mirror` for the asyncio client: `await mirror.apply(event)`, a reset reads the history
    again through an awaitable `reload`."""

    async def apply(self, event: ChangeEvent) -> None:  # type: ignore[override]
        if self._follow(event):
            self.messages = list(await self._reload())


def search_mode(mode: str) -> pb.SearchMode.ValueType:
    if mode == "phrase":
        return pb.SEARCH_MODE_PHRASE
    if mode == "all_words":
        return pb.SEARCH_MODE_ALL_WORDS
    raise ValueError('mode must be "phrase" or "all_words"')


# Hits the clients ask for per search response: the server also stops a response at about 1 MiB.
SEARCH_HITS_PER_RESPONSE = 1000


def collect_search(responses: Iterable[pb.SearchMessagesResponse]) -> list[SearchResult]:
    """The hits of a search's responses, packed (`hits`) or one per response, pieces joined."""
    results: list[SearchResult] = []
    head: pb.SearchMessagesResponse | pb.SearchHit | None = None
    pieces: list[str] = []
    for response in responses:
        for hit in response.hits or (response,):
            if head is None:
                head = hit
            pieces.append(hit.content)
            if not hit.more_pieces:
                results.append(SearchResult(head.id, head.role, "".join(pieces), head.session_id))
                head, pieces = None, []
    if head is not None:
        raise SessionsError(grpc.StatusCode.DATA_LOSS, "stream ended inside a search hit", "INVALID_STREAM", {})
    return results
