"""The SessionService servicer: decodes requests, calls the domain, encodes responses.

Mapping only: no SQL, no session rules. Every handler checks the routing header against the
object it names (an empty ImportMessages stream names none, and does nothing), frames message
content (framing.py), and hands its work to `calls`, which answers, or refuses with a status
and ErrorInfo details.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain import jsjson
from sessions_server.domain import search as search_rules
from sessions_server.domain.compactor import Policy
from sessions_server.domain.errors import InvalidArgument, SessionsError, Unavailable
from sessions_server.domain.history import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_SIZE, BatchMarker, RecentSummary
from sessions_server.domain.keys import check_object_key
from sessions_server.domain.limits import (
    COMPACTIONS_PAGE_DEFAULT,
    COMPACTIONS_PAGE_MAX,
    RESPONSE_PAYLOAD_BYTES,
    SESSIONS_PAGE_DEFAULT,
    SESSIONS_PAGE_MAX,
    exceeded,
    page_size,
)
from sessions_server.domain.messages import FieldNames
from sessions_server.domain.placement import routing_key
from sessions_server.domain.records import Parent
from sessions_server.domain.service import AppendInput, SessionsService, check_batch_length
from sessions_server.domain.views import MessageView
from sessions_server.transport import calls, feed_frames, framing, page_tokens
from sessions_server.transport.auth import TokenAuthority
from sessions_server.transport.handlers import OBJECT_KEY_HEADER
from sessions_server.transport.pieces import AssemblyBudget, Pieces

ROW_STATS_PER_FRAME = 1000
ATTACHMENT_FRAME_BYTES = RESPONSE_PAYLOAD_BYTES
FRAME_BUDGET_BYTES = RESPONSE_PAYLOAD_BYTES
DEFAULT_PROGRESS_SECONDS = 10.0
UPLOAD_FIELDS = FieldNames(text="json_piece", parent_id="header.parent_id")
IMPORT_PIECES_FIELDS = FieldNames(text="json_piece", parent_id="parent_id")

Resp = TypeVar("Resp")


class Draining:
    """Set while the server shuts down: new calls are refused with UNAVAILABLE."""

    def __init__(self) -> None:
        self.active = False


def _parent(mode: int, parent_id: str, within: str = "") -> Parent:
    """`within`: the path of the message holding the fields (`items[2].`), for the error's field."""
    if mode == pb.PARENT_MODE_ROOT:
        if parent_id:  # as with AUTO: a parent named and then ignored is a caller's mistake
            raise InvalidArgument(
                f"{within}parent_id must be empty when parent_mode is PARENT_MODE_ROOT", field=f"{within}parent_id"
            )
        return Parent.root()
    if mode == pb.PARENT_MODE_ID or (mode == pb.PARENT_MODE_UNSPECIFIED and parent_id):
        return Parent.of(parent_id)
    if mode in (pb.PARENT_MODE_AUTO, pb.PARENT_MODE_UNSPECIFIED):
        if parent_id:
            raise InvalidArgument(
                f"{within}parent_id must be empty when parent_mode is PARENT_MODE_AUTO", field=f"{within}parent_id"
            )
        return Parent.auto()
    raise InvalidArgument(f"unknown {within}parent_mode {mode}", field=f"{within}parent_mode")


def _inline(mode: int) -> bool:
    if mode not in (pb.ATTACHMENT_MODE_UNSPECIFIED, pb.ATTACHMENT_MODE_INLINE, pb.ATTACHMENT_MODE_POINTER):
        raise InvalidArgument(f"unknown attachments mode {mode}", field="attachments")
    return mode != pb.ATTACHMENT_MODE_POINTER


def _from_client(source: int, within: str = "") -> bool:
    if source not in (pb.SOURCE_UNSPECIFIED, pb.SOURCE_SERVER, pb.SOURCE_CLIENT):
        raise InvalidArgument(f"unknown {within}source {source}", field=f"{within}source")
    return source == pb.SOURCE_CLIENT


@dataclass(frozen=True)
class _Upload:
    """What an UploadMessage header asks for, checked before the message arrives (it may be large)."""

    operation: int
    parent: Parent | None  # None for an update, which keeps the message's parent
    from_client: bool


def _in_header(exc: InvalidArgument) -> InvalidArgument:
    """`exc` about a field of an UploadMessage header, named by its path in the request."""
    field = exc.metadata.get("field", "")
    if not field:
        return exc
    message = f"header.{exc.message}" if exc.message.startswith(field) else exc.message
    return InvalidArgument(message, reason=exc.reason, **{**exc.metadata, "field": f"header.{field}"})


def _upload(header: pb.UploadHeader) -> _Upload:
    if header.operation not in (pb.UPLOAD_OPERATION_APPEND, pb.UPLOAD_OPERATION_UPDATE, pb.UPLOAD_OPERATION_UPSERT):
        raise InvalidArgument("header.operation must be APPEND, UPDATE or UPSERT", field="header.operation")
    parent = _parent(header.parent_mode, header.parent_id, "header.")  # checked for an update too
    updating = header.operation == pb.UPLOAD_OPERATION_UPDATE
    return _Upload(header.operation, None if updating else parent, _from_client(header.source, "header."))


_LOCKING_EXPORT = "an export that locks its object for a move (lock_for_move)"
_HOLDING_IMPORT = "an import that holds its object for a move (hold_for_move)"


class _Granted:
    """A long call's authorization, checked again after the tokens are reloaded (SIGHUP): a
    revoked token must not go on receiving a feed or a read, or writing through a stream, it
    opened before. `recheck` compares a generation, nothing more, until a reload took effect."""

    def __init__(
        self,
        authority: TokenAuthority | None,
        context: Any,
        object_key: str,
        *,
        write: bool,
        server_wide: str | None = None,
    ) -> None:
        self._authority = authority
        self._context = context
        self._object_key = object_key
        self._write = write
        self._server_wide = server_wide  # what needs a token granting every key (a move's step), if any
        self._generation = authority.generation if authority is not None else 0

    def recheck(self) -> None:
        authority = self._authority
        if authority is not None and authority.generation != self._generation:
            metadata = self._context.invocation_metadata() or ()
            authority.check(metadata, self._object_key, write=self._write)
            if self._server_wide is not None:
                authority.check_server_wide(metadata, self._server_wide)
            self._generation = authority.generation


class SessionServicer(pb_grpc.SessionServiceServicer):
    """gRPC handlers for sessions.v1.SessionService."""

    def __init__(
        self,
        service: SessionsService,
        draining: Draining,
        *,
        progress_seconds: float = DEFAULT_PROGRESS_SECONDS,
        authority: TokenAuthority | None = None,
        require_routing_header: bool = False,
    ) -> None:
        self._service = service
        self._draining = draining
        self._require_routing_header = require_routing_header
        self._progress_seconds = progress_seconds
        self._authority = authority
        self._slots = calls.StreamSlots(
            service.limits.max_concurrent_streams,
            per_token=service.limits.max_streams_per_token,
            token_of=None if authority is None else authority.token_id,
        )
        self.assembly = AssemblyBudget(service.limits.max_assembly_bytes)
        self._feed_frames = feed_frames.FeedFrames(feed_frames.FEED_FRAMES_BYTES)

    async def _stream(
        self,
        context: Any,
        run: Callable[[], AsyncIterator[Any]],
        object_key: str,
        *,
        write: bool = False,
        server_wide: str | None = None,
        taken_within: calls.TakenWithin | None = None,
    ) -> None:
        """A server stream (`calls.stream`) each of whose responses is sent only while the
        caller's token still grants what the call was admitted for (`write`: an export;
        `server_wide`: one locking its object for a move, see `_admit_mover`)."""
        granted = _Granted(self._authority, context, object_key, write=write, server_wide=server_wide)
        await calls.stream(context, run, self._slots, still_granted=granted.recheck, taken_within=taken_within)

    def _pieces(self, holder: str | None, *, from_client: bool) -> Pieces:
        """A message arriving in pieces, charged to `holder` (the call's token id): `source=client`
        ones have their own size limit."""
        cap = self._service.limits.max_client_message_bytes if from_client else 0
        return Pieces(
            self.assembly,
            max_bytes=cap,
            what="the message from a client",
            limit_name="max_client_message_bytes",
            holder=holder,
        )

    def _admit(self, context: grpc.aio.ServicerContext[Any, Any], object_key: str, *, write: bool) -> str | None:
        """Refuses the call while draining, authorizes it (before anything reveals whether the
        object exists), and checks the routing header against the body. Returns the id of the
        call's token (None without tokens): whose fair share of the server's limits it takes."""
        if self._draining.active:
            raise Unavailable("the server is shutting down; retry on a new connection")
        metadata = context.invocation_metadata() or ()
        token = None
        if self._authority is not None:
            token = self._authority.check(metadata, object_key, write=write).digest
        routed = False
        for key, value in metadata:
            if key == OBJECT_KEY_HEADER:
                raw = value if isinstance(value, str) else value.decode()
                header = urllib.parse.unquote(raw)
                if header != object_key:
                    raise InvalidArgument(
                        f"{OBJECT_KEY_HEADER} metadata ({header!r}) differs from object_key ({object_key!r})",
                        reason="OBJECT_KEY_MISMATCH",
                        field="object_key",
                    )
                if self._require_routing_header and raw != (spelled := routing_key(object_key).decode("ascii")):
                    # A proxy hashes the header's text: another spelling of the same key (`a/b`
                    # for `a%2Fb`, lower-case hex) went to another shard, a second copy there.
                    raise InvalidArgument(
                        f"{OBJECT_KEY_HEADER} metadata must spell the key as the clients do, {spelled!r}, not "
                        f"{raw!r}: the proxy routes by its text, and another spelling of the same key reaches "
                        "another shard (UTF-8, every byte but letters, digits and _.-~ as %XX in upper case)",
                        reason="OBJECT_KEY_MISMATCH",
                        field="object_key",
                    )
                routed = True
        if not routed and self._require_routing_header:
            # Its proxy routes calls by the header: one without it lands on any shard, where it
            # would be refused, or would start a second copy of the object.
            raise InvalidArgument(
                f"{OBJECT_KEY_HEADER} metadata is missing: this server is a shard, and its proxy routes "
                f"each call by it; send the object key (percent-encoded) as {OBJECT_KEY_HEADER} "
                "(the clients do)",
                reason="OBJECT_KEY_MISMATCH",
                field="object_key",
            )
        return token

    # ── writes ──────────────────────────────────────────────────────────────

    # Appends answer with their response already encoded (framing.encoded_append_result): the
    # method's serializer passes bytes through.
    async def AppendMessage(self, request: pb.AppendMessageRequest, context: Any) -> bytes:  # type: ignore[override]
        async def run() -> bytes:
            holder = self._admit(context, request.object_key, write=True)
            text = request.message_json  # each access decodes the field anew
            with self.assembly.holding((text,), holder):
                result = await self._service.append(
                    request.object_key,
                    request.session_id,
                    text,
                    _parent(request.parent_mode, request.parent_id),
                    from_client=_from_client(request.source),
                )
                return framing.encoded_append_result(
                    result, framing.ResponseBudget(), pb.AppendMessageResponse, text, request.omit_json_as_sent
                )

        return await calls.unary(context, run)

    async def AppendMessages(self, request: pb.AppendMessagesRequest, context: Any) -> bytes:  # type: ignore[override]
        async def run() -> bytes:
            holder = self._admit(context, request.object_key, write=True)
            check_batch_length(len(request.items))
            items = [
                AppendInput(
                    item.message_json,
                    _parent(item.parent_mode, item.parent_id, f"items[{index}]."),
                    _from_client(item.source, f"items[{index}]."),
                )
                for index, item in enumerate(request.items)
            ]
            with self.assembly.holding((item.text for item in items), holder):
                results = await self._service.append_many(request.object_key, request.session_id, items)
                return framing.encoded_append_results(results, (item.text for item in items), request.omit_json_as_sent)

        return await calls.unary(context, run)

    async def UpdateMessage(self, request: pb.UpdateMessageRequest, context: Any) -> pb.UpdateMessageResponse:
        async def run() -> pb.UpdateMessageResponse:
            holder = self._admit(context, request.object_key, write=True)
            text = request.message_json
            with self.assembly.holding((text,), holder):
                result = await self._service.update(
                    request.object_key, request.session_id, text, from_client=_from_client(request.source)
                )
            response = pb.UpdateMessageResponse(found=result.found, changed=result.changed)
            if result.message is not None:
                response.message.CopyFrom(
                    framing.written_message(result.message, sent=text, omit_as_sent=request.omit_json_as_sent)
                )
            return response

        return await calls.unary(context, run)

    async def UpsertMessage(self, request: pb.UpsertMessageRequest, context: Any) -> pb.UpsertMessageResponse:
        async def run() -> pb.UpsertMessageResponse:
            holder = self._admit(context, request.object_key, write=True)
            text = request.message_json
            with self.assembly.holding((text,), holder):
                inserted, result = await self._service.upsert(
                    request.object_key,
                    request.session_id,
                    text,
                    _parent(request.parent_mode, request.parent_id),
                    from_client=_from_client(request.source),
                )
            response = pb.UpsertMessageResponse(inserted=inserted, changed=result.changed)
            if result.message is not None:
                response.message.CopyFrom(
                    framing.written_message(result.message, sent=text, omit_as_sent=request.omit_json_as_sent)
                )
            return response

        return await calls.unary(context, run)

    async def UploadMessage(
        self, request_iterator: AsyncIterable[pb.UploadMessageRequest], context: Any
    ) -> pb.UploadMessageResponse:
        async def run() -> pb.UploadMessageResponse:
            frames = request_iterator.__aiter__()
            first = await calls.next_frame(frames, context)
            if first is None:
                raise InvalidArgument("UploadMessage stream carried no frames", reason="INVALID_STREAM")
            if not first.HasField("header"):
                raise InvalidArgument(
                    "the first UploadMessage frame must carry the header", reason="INVALID_STREAM", field="header"
                )
            header = first.header
            try:
                self._service.check_names(header.object_key, header.session_id)
            except InvalidArgument as exc:
                raise _in_header(exc) from None
            holder = self._admit(context, header.object_key, write=True)
            upload = _upload(header)
            granted = _Granted(self._authority, context, header.object_key, write=True)
            with self._pieces(holder, from_client=upload.from_client) as pieces:
                pieces.add(first.json_piece)
                while (frame := await calls.next_frame(frames, context, inside_message=True)) is not None:
                    granted.recheck()
                    if frame.HasField("header"):
                        raise InvalidArgument(
                            "only the first UploadMessage frame may carry a header",
                            reason="INVALID_STREAM",
                            field="header",
                        )
                    pieces.add(frame.json_piece)
                granted.recheck()
                return await written(header, upload, pieces.text())

        async def written(header: pb.UploadHeader, upload: _Upload, text: str) -> pb.UploadMessageResponse:
            key, session_id, from_client = header.object_key, header.session_id, upload.from_client
            if upload.parent is None:  # an update: the message keeps its parent
                result = await self._service.update(
                    key, session_id, text, from_client=from_client, fields=UPLOAD_FIELDS
                )
                inserted = False
            elif upload.operation == pb.UPLOAD_OPERATION_APPEND:
                appended = await self._service.append(
                    key, session_id, text, upload.parent, from_client=from_client, fields=UPLOAD_FIELDS
                )
                return pb.UploadMessageResponse(
                    inserted=appended.inserted, found=True, message=framing.written_message(appended.message, sent=text)
                )
            else:
                inserted, result = await self._service.upsert(
                    key, session_id, text, upload.parent, from_client=from_client, fields=UPLOAD_FIELDS
                )
            response = pb.UploadMessageResponse(inserted=inserted, found=result.found, changed=result.changed)
            if result.message is not None:
                response.message.CopyFrom(framing.written_message(result.message, sent=text))
            return response

        return await calls.client_stream(context, request_iterator, run, self._slots)

    async def DeleteMessages(self, request: pb.DeleteMessagesRequest, context: Any) -> pb.DeleteMessagesResponse:
        async def run() -> pb.DeleteMessagesResponse:
            self._admit(context, request.object_key, write=True)
            deleted = await self._service.delete(request.object_key, request.session_id, request.message_ids)
            return pb.DeleteMessagesResponse(deleted_count=deleted)

        return await calls.unary(context, run)

    async def ClearMessages(self, request: pb.ClearMessagesRequest, context: Any) -> pb.ClearMessagesResponse:
        async def run() -> pb.ClearMessagesResponse:
            self._admit(context, request.object_key, write=True)
            deleted = await self._service.clear(request.object_key, request.session_id)
            return pb.ClearMessagesResponse(deleted_count=deleted)

        return await calls.unary(context, run)

    async def ImportMessages(
        self, request_iterator: AsyncIterable[pb.ImportMessagesRequest], context: Any
    ) -> pb.ImportMessagesResponse:
        async def run() -> pb.ImportMessagesResponse:
            frames = request_iterator.__aiter__()
            first = await calls.next_frame(frames, context)
            if first is None:
                return pb.ImportMessagesResponse()
            object_key, session_id = first.object_key, first.session_id
            holder = self._admit(context, object_key, write=True)
            granted = _Granted(self._authority, context, object_key, write=True)
            pieces = self._pieces(holder, from_client=False)  # the message in pieces under way, if any
            try:
                async with self._service.importer(object_key, session_id) as importer:
                    # Each message stays charged to the assembly budget until its write is done:
                    # the importer calls its release.
                    charges = self.assembly.until_written(importer.wait_for_writes, holder)

                    async def add_whole(frame: pb.ImportMessagesRequest) -> None:
                        """The frame's whole messages, charged together until the last is written."""
                        texts = [message.json for message in frame.messages]  # each access decodes anew
                        release = await charges.whole(texts)
                        try:
                            for index, (message, text) in enumerate(zip(frame.messages, texts, strict=True)):
                                parent = message.parent_id if message.HasField("parent_id") else None
                                fields = FieldNames(f"messages[{index}].json", f"messages[{index}].parent_id")
                                await importer.add(text, parent, message.created_at_ms, fields)
                        finally:
                            importer.release_after(release)

                    async def next_frame(inside_message: bool = False) -> Any:
                        try:
                            return await calls.next_frame(frames, context, inside_message=inside_message)
                        except SessionsError as exc:  # a frame not decodable, or not in time
                            kept = f"{exc.message}; {importer.kept()}"
                            raise type(exc)(kept, reason=exc.reason, **exc.metadata) from None

                    head: pb.ImportMessagesRequest | None = None
                    frame: pb.ImportMessagesRequest | None = first
                    while frame is not None:
                        granted.recheck()
                        if frame.object_key and frame.object_key != object_key:
                            raise InvalidArgument(
                                f"every ImportMessages frame must name the same object_key; {importer.kept()}",
                                reason="INVALID_STREAM",
                                field="object_key",
                            )
                        if frame.session_id and frame.session_id != session_id:  # else imported to the first's
                            raise InvalidArgument(
                                "every ImportMessages frame must name the first frame's session_id (or none); "
                                + importer.kept(),
                                reason="INVALID_STREAM",
                                field="session_id",
                            )
                        if frame.messages:
                            if head is not None:
                                raise InvalidArgument(
                                    "whole messages came while a message sent in pieces was incomplete; "
                                    + importer.kept(),
                                    reason="INVALID_STREAM",
                                    field="messages",
                                )
                            await add_whole(frame)
                        if head is None and not frame.json_piece and not frame.more_pieces:
                            # No piece: the frame named the object, or held whole messages.
                            frame = await next_frame()
                            continue
                        if head is None:
                            head = frame
                        await charges.piece(pieces, frame.json_piece)
                        if not frame.more_pieces:
                            parent_id = head.parent_id if head.HasField("parent_id") else None
                            await importer.add(
                                pieces.text(), parent_id, head.created_at_ms, IMPORT_PIECES_FIELDS, pieces.hand_over()
                            )
                            head = None
                        frame = await next_frame(inside_message=head is not None)
                    if head is not None:
                        raise InvalidArgument(
                            f"the stream ended inside a message (more_pieces was true); {importer.kept()}",
                            reason="INVALID_STREAM",
                            field="more_pieces",
                        )
            finally:
                pieces.release()  # a stream that ended inside a message
            return pb.ImportMessagesResponse(imported_count=importer.imported, skipped_count=importer.skipped)

        return await calls.client_stream(context, request_iterator, run, self._slots)

    # ── reads ───────────────────────────────────────────────────────────────

    async def GetMessage(self, request: pb.GetMessageRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[bytes]:
            self._admit(context, request.object_key, write=False)
            view = await self._service.get_message(
                request.object_key, request.session_id, request.message_id, inline=_inline(request.attachments)
            )
            if view is not None:
                for response in framing.message_responses(view, pb.GetMessageResponse):
                    yield response

        await self._stream(context, run, request.object_key)

    async def GetMessages(self, request: pb.GetMessagesRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.GetMessagesResponse | bytes]:
            self._admit(context, request.object_key, write=False)
            views = self._service.get_messages(
                request.object_key, request.session_id, request.message_ids, inline=_inline(request.attachments)
            )
            async with contextlib.aclosing(views):
                async for response, _ in _responses(views, request.max_messages_per_response, pb.GetMessagesResponse):
                    yield response

        await self._stream(context, run, request.object_key)

    async def GetLatestLeaf(self, request: pb.GetLatestLeafRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[bytes]:
            self._admit(context, request.object_key, write=False)
            view = await self._service.get_latest_leaf(
                request.object_key, request.session_id, inline=_inline(request.attachments)
            )
            if view is not None:
                for response in framing.message_responses(view, pb.GetLatestLeafResponse):
                    yield response

        await self._stream(context, run, request.object_key)

    async def GetBranches(self, request: pb.GetBranchesRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.GetBranchesResponse | bytes]:
            self._admit(context, request.object_key, write=False)
            views = self._service.get_branches(
                request.object_key, request.session_id, request.message_id, inline=_inline(request.attachments)
            )
            async with contextlib.aclosing(views):
                async for response, _ in _responses(views, request.max_messages_per_response, pb.GetBranchesResponse):
                    yield response

        await self._stream(context, run, request.object_key)

    async def StreamHistory(self, request: pb.StreamHistoryRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.StreamHistoryResponse | bytes]:
            self._admit(context, request.object_key, write=False)
            views = self._service.history(
                request.object_key,
                request.session_id,
                leaf_id=request.leaf_id,
                newest_first=request.newest_first,
                inline=_inline(request.attachments),
                limit=request.max_messages,
            )
            batches = (
                BatchMarker(request.batch_size or DEFAULT_BATCH_SIZE, request.max_batch_bytes or DEFAULT_BATCH_BYTES)
                if request.batch_size or request.max_batch_bytes
                else None
            )
            async with contextlib.aclosing(views):
                responses = _responses(views, request.max_messages_per_response, pb.StreamHistoryResponse, batches)
                async for response, batch_end in responses:
                    yield framing.with_batch_end(response) if batch_end else response

        await self._stream(context, run, request.object_key)

    async def GetRecentHistory(self, request: pb.GetRecentHistoryRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.GetRecentHistoryResponse | bytes]:
            self._admit(context, request.object_key, write=False)
            items = self._service.recent_history(
                request.object_key,
                request.session_id,
                request.max_content_bytes,
                leaf_id=request.leaf_id,
                inline=_inline(request.attachments),
            )
            async with contextlib.aclosing(items):
                summary = await anext(items)
                assert isinstance(summary, RecentSummary)
                yield pb.GetRecentHistoryResponse(
                    summary=pb.RecentHistorySummary(
                        truncated=summary.truncated, total_content_bytes=summary.total_content_bytes
                    )
                )
                windows: AsyncIterator[list[MessageView]] = items  # type: ignore[assignment]
                async for response, _ in _responses(
                    windows, request.max_messages_per_response, pb.GetRecentHistoryResponse
                ):
                    yield response

        await self._stream(context, run, request.object_key)

    async def GetHistoryRowStats(self, request: pb.GetHistoryRowStatsRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.GetHistoryRowStatsResponse]:
            self._admit(context, request.object_key, write=False)
            stats = await self._service.row_stats(request.object_key, request.session_id, leaf_id=request.leaf_id)
            frame = pb.GetHistoryRowStatsResponse()
            # Added in place and sized by arithmetic: building each RowStat, sizing it and copying
            # it into the frame took three quarters of the call (10,000 rows: 59 ms against 14).
            add = frame.stats.add
            count = size = 0
            for s in stats:
                stat_size = _row_stat_bytes(s.id, s.role)
                if count and (count >= ROW_STATS_PER_FRAME or size + stat_size > FRAME_BUDGET_BYTES):
                    yield frame
                    frame = pb.GetHistoryRowStatsResponse()
                    add = frame.stats.add
                    count = size = 0
                add(id=s.id, role=s.role, bytes=s.bytes, token_estimate=s.token_estimate)
                count += 1
                size += stat_size
            if count:
                yield frame

        await self._stream(context, run, request.object_key)

    async def ReadAttachment(self, request: pb.ReadAttachmentRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.ReadAttachmentResponse]:
            self._admit(context, request.object_key, write=False)
            first = True
            chunks = self._service.read_attachment(request.object_key, request.hash)
            async with contextlib.aclosing(chunks):
                async for media_type, size, data in chunks:
                    for start in range(0, max(len(data), 1), ATTACHMENT_FRAME_BYTES):
                        response = pb.ReadAttachmentResponse(data=data[start : start + ATTACHMENT_FRAME_BYTES])
                        if first:
                            response.media_type = media_type
                            response.size_bytes = size
                            first = False
                        yield response

        await self._stream(context, run, request.object_key)

    # ── compaction ──────────────────────────────────────────────────────────

    async def AddCompaction(self, request: pb.AddCompactionRequest, context: Any) -> pb.AddCompactionResponse:
        async def run() -> pb.AddCompactionResponse:
            self._admit(context, request.object_key, write=True)
            record = await self._service.compactor.add(
                request.object_key,
                request.session_id,
                request.summary,
                request.from_message_id,
                request.to_message_id,
                event="compact" if request.from_compact else "compaction",
                plan_token=request.plan_token,
            )
            return pb.AddCompactionResponse(compaction=framing.compaction_message(record))

        return await calls.unary(context, run)

    async def ListCompactions(self, request: pb.ListCompactionsRequest, context: Any) -> pb.ListCompactionsResponse:
        async def run() -> pb.ListCompactionsResponse:
            self._admit(context, request.object_key, write=False)
            after = page_tokens.compactions_after(request.page_token, request.object_key, request.session_id)
            size_limit = page_size(request.page_size, default=COMPACTIONS_PAGE_DEFAULT, maximum=COMPACTIONS_PAGE_MAX)
            records, more = await self._service.compactor.records_after(
                request.object_key, request.session_id, after, size_limit, FRAME_BUDGET_BYTES
            )
            response = pb.ListCompactionsResponse()
            budget = FRAME_BUDGET_BYTES
            for record in records:
                item = framing.compaction_message(record)
                if response.compactions and item.ByteSize() + 16 > budget:
                    more = True
                    break
                response.compactions.append(item)
                budget -= item.ByteSize() + 16
            if more:
                response.next_page_token = page_tokens.compaction_token(
                    request.object_key, request.session_id, response.compactions[-1].seq
                )
            return response

        return await calls.unary(context, run)

    async def PlanCompaction(self, request: pb.PlanCompactionRequest, context: Any) -> pb.PlanCompactionResponse:
        async def run() -> pb.PlanCompactionResponse:
            self._admit(context, request.object_key, write=False)
            held = await self._service.compactor.plan_held(
                request.object_key,
                request.session_id,
                leaf_id=request.leaf_id,
                keep_recent_tokens=request.keep_recent_tokens,
                max_prompt_bytes=FRAME_BUDGET_BYTES,
                holder=self._plan_holder(context, request.object_key),
            )
            if held is None:
                return pb.PlanCompactionResponse(planned=False)
            plan, token = held
            return pb.PlanCompactionResponse(
                planned=True,
                from_message_id=plan.from_message_id,
                to_message_id=plan.to_message_id,
                prompt=jsjson.well_formed(plan.prompt),  # a protobuf string carries no lone surrogate
                budget_tokens=plan.budget_tokens,
                plan_token=token,
            )

        return await calls.unary(context, run)

    async def Compact(self, request: pb.CompactRequest, context: Any) -> pb.CompactResponse:
        async def run() -> pb.CompactResponse:
            self._admit(context, request.object_key, write=True)
            record = await self._service.compactor.compact(
                request.object_key,
                request.session_id,
                leaf_id=request.leaf_id,
                keep_recent_tokens=request.keep_recent_tokens,
            )
            if record is None:
                return pb.CompactResponse(compacted=False)
            return pb.CompactResponse(compacted=True, compaction=framing.compaction_message(record))

        return await calls.unary(context, run)

    async def SetCompactionPolicy(
        self, request: pb.SetCompactionPolicyRequest, context: Any
    ) -> pb.SetCompactionPolicyResponse:
        async def run() -> pb.SetCompactionPolicyResponse:
            self._admit(context, request.object_key, write=True)
            policy = await self._service.compactor.set_policy(
                request.object_key,
                request.session_id,
                Policy(request.policy.threshold_tokens, request.policy.keep_recent_tokens),
            )
            return pb.SetCompactionPolicyResponse(policy=_policy(policy))

        return await calls.unary(context, run)

    async def GetCompactionPolicy(
        self, request: pb.GetCompactionPolicyRequest, context: Any
    ) -> pb.GetCompactionPolicyResponse:
        async def run() -> pb.GetCompactionPolicyResponse:
            self._admit(context, request.object_key, write=False)
            policy = await self._service.compactor.get_policy(request.object_key, request.session_id)
            return pb.GetCompactionPolicyResponse(policy=_policy(policy))

        return await calls.unary(context, run)

    # ── search ──────────────────────────────────────────────────────────────

    async def SearchMessages(self, request: pb.SearchMessagesRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.SearchMessagesResponse]:
            tenant = self._admit(context, request.object_key, write=False)
            if request.mode not in (pb.SEARCH_MODE_UNSPECIFIED, pb.SEARCH_MODE_PHRASE, pb.SEARCH_MODE_ALL_WORDS):
                raise InvalidArgument(f"unknown search mode {request.mode}", field="mode")
            windows = self._service.search_windows(
                request.object_key,
                request.session_id,
                request.query,
                limit=request.limit if request.HasField("limit") else None,
                mode=search_rules.ALL_WORDS if request.mode == pb.SEARCH_MODE_ALL_WORDS else search_rules.PHRASE,
                all_sessions=request.all_sessions,
                tenant=tenant,
            )
            async with contextlib.aclosing(windows):
                async for hits in windows:
                    for response in framing.search_responses(hits, request.max_hits_per_response):
                        yield response

        await self._stream(context, run, request.object_key)

    # ── change feed ─────────────────────────────────────────────────────────

    async def Subscribe(self, request: pb.SubscribeRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.SubscribeResponse]:
            self._admit(context, request.object_key, write=False)
            inline = _inline(request.attachments)
            items = self._service.subscribe(
                request.object_key,
                request.session_id if request.HasField("session_id") else None,
                request.resume_after_revision,
                progress_seconds=self._progress_seconds,
            )
            granted = _Granted(self._authority, context, request.object_key, write=False)  # a feed runs for hours
            async with contextlib.aclosing(items):
                async for item in items:
                    granted.recheck()
                    for response in feed_frames.feed_responses(item, inline, self._feed_frames):
                        yield response

        await self._stream(context, run, request.object_key)

    # ── admin ───────────────────────────────────────────────────────────────

    async def ListSessions(self, request: pb.ListSessionsRequest, context: Any) -> pb.ListSessionsResponse:
        async def run() -> pb.ListSessionsResponse:
            self._admit(context, request.object_key, write=False)
            after = page_tokens.session_after(request.page_token, request.object_key)
            size_limit = page_size(request.page_size, default=SESSIONS_PAGE_DEFAULT, maximum=SESSIONS_PAGE_MAX)
            # One more than a page: whether another page follows.
            page = await self._service.list_sessions(request.object_key, after, size_limit + 1)
            response = pb.ListSessionsResponse()
            add = response.sessions.add
            budget = FRAME_BUDGET_BYTES  # ids run to 1 KiB: a full page of long ones would not fit
            for taken, (sid, count) in enumerate(page):
                size = framing.json_bytes(sid) + 24
                if taken and (taken >= size_limit or size > budget):
                    response.next_page_token = page_tokens.session_token(request.object_key, page[taken - 1][0])
                    break
                add(session_id=sid, message_count=count)
                budget -= size
            return response

        return await calls.unary(context, run)

    async def GetObjectStats(self, request: pb.GetObjectStatsRequest, context: Any) -> pb.GetObjectStatsResponse:
        async def run() -> pb.GetObjectStatsResponse:
            self._admit(context, request.object_key, write=False)
            return pb.GetObjectStatsResponse(**await self._service.object_stats(request.object_key))

        return await calls.unary(context, run)

    async def ListObjects(self, request: pb.ListObjectsRequest, context: Any) -> pb.ListObjectsResponse:
        async def run() -> pb.ListObjectsResponse:
            self._admit_admin(context, "listing objects")
            keys, token = await self._service.objects.list_keys(request.page_size, request.page_token)
            return pb.ListObjectsResponse(object_keys=keys, next_page_token=token)

        return await calls.unary(context, run)

    async def ExportObject(self, request: pb.ExportObjectRequest, context: Any) -> None:  # type: ignore[override]
        async def run() -> AsyncIterator[pb.ExportObjectResponse]:
            self._admit(context, request.object_key, write=True)
            if request.lock_for_move:
                self._admit_mover(context, _LOCKING_EXPORT)
            frames = self._service.objects.export(
                request.object_key, lock_for_move=request.lock_for_move, lease_seconds=request.lease_seconds
            )
            async with contextlib.aclosing(frames):
                async for frame in frames:
                    yield pb.ExportObjectResponse(
                        size_bytes=frame.size_bytes, data=frame.data, sha256=frame.sha256, move_id=frame.move_id
                    )

        await self._stream(
            context,
            run,
            request.object_key,
            write=True,
            server_wide=_LOCKING_EXPORT if request.lock_for_move else None,
            taken_within=calls.TakenWithin(EXPORT_IDLE_SECONDS, _export_stalled),
        )

    async def ImportObject(
        self, request_iterator: AsyncIterable[pb.ImportObjectRequest], context: Any
    ) -> pb.ImportObjectResponse:
        async def run() -> pb.ImportObjectResponse:
            frames = request_iterator.__aiter__()
            first = await calls.next_frame(frames, context)
            if first is None:
                raise InvalidArgument(
                    "the first ImportObject frame must name object_key", reason="INVALID_STREAM", field="object_key"
                )
            # An empty one named as every call's is (the service checks the key again).
            check_object_key(first.object_key, max_bytes=self._service.max_object_key_bytes)
            self._admit(context, first.object_key, write=True)
            mover = _HOLDING_IMPORT if first.hold_for_move else None
            if mover is not None:
                self._admit_mover(context, mover)
            # Checked again at each frame after a reload: the all-keys grant a hold needs as well.
            granted = _Granted(self._authority, context, first.object_key, write=True, server_wide=mover)

            async def data() -> AsyncIterator[tuple[bytes, str]]:
                frame: pb.ImportObjectRequest | None = first
                while frame is not None:
                    granted.recheck()
                    if frame.object_key and frame.object_key != first.object_key:
                        raise InvalidArgument(
                            "every ImportObject frame must name the first frame's object_key (or none)",
                            reason="INVALID_STREAM",
                            field="object_key",
                        )
                    yield frame.data, frame.sha256
                    frame = await calls.next_frame(frames, context)

            size, rows, hold = await self._service.objects.receive(
                first.object_key,
                data(),
                replace=first.replace,
                hold_for_move=first.hold_for_move,
            )
            return pb.ImportObjectResponse(size_bytes=size, message_rows=rows, move_id=hold)

        return await calls.client_stream(context, request_iterator, run, self._slots)

    async def DeleteObject(self, request: pb.DeleteObjectRequest, context: Any) -> pb.DeleteObjectResponse:
        async def run() -> pb.DeleteObjectResponse:
            self._admit(context, request.object_key, write=True)
            objects = self._service.objects
            if request.erase:
                deleted = await objects.erase(request.object_key, moved_to=request.moved_to, move_id=request.move_id)
            else:
                self._admit_mover(context, "a delete that ends a move (DeleteObject without erase)")
                deleted = await objects.delete(request.object_key, moved_to=request.moved_to, move_id=request.move_id)
            return pb.DeleteObjectResponse(deleted=deleted)

        return await calls.unary(context, run)

    async def AbortMove(self, request: pb.AbortMoveRequest, context: Any) -> pb.AbortMoveResponse:
        async def run() -> pb.AbortMoveResponse:
            self._admit(context, request.object_key, write=True)
            self._admit_mover(context, "releasing a move lock (AbortMove)")
            released = await self._service.objects.abort_move(
                request.object_key, source_lock_only=request.source_lock_only
            )
            return pb.AbortMoveResponse(was_locked=released.held, was_arrival_hold=released.arrival)

        return await calls.unary(context, run)

    async def VacuumObject(self, request: pb.VacuumObjectRequest, context: Any) -> pb.VacuumObjectResponse:
        async def run() -> pb.VacuumObjectResponse:
            self._admit(context, request.object_key, write=True)
            before, after = await self._service.objects.vacuum(request.object_key)
            return pb.VacuumObjectResponse(file_bytes_before=before, file_bytes_after=after)

        return await calls.unary(context, run)

    def _plan_holder(self, context: Any, object_key: str) -> str | None:
        """Whose plans a plan counts against (its token's), or None when the caller may only
        read `object_key`: it could not store the summary, and its plans would crowd out others'."""
        if self._authority is None:
            return ""
        grant = self._authority.authenticate(context.invocation_metadata() or ())
        return grant.digest if grant.allows(object_key, True) else None

    def _admit_mover(self, context: Any, what: str) -> None:
        """A move's steps (`what`, for messages) move keys between servers, and a key moved away is
        refused naming its destination: an operator's calls, which need a token granting every
        key. (With a tenant's write grant, a tenant could hold its keys against a re-shard, or
        have every reader of a key told it moved to an address of its choosing.)"""
        if self._authority is not None:
            self._authority.check_server_wide(context.invocation_metadata() or (), what)

    def _admit_admin(self, context: Any, what: str) -> None:
        """Server-wide admin calls (`what` they do, for messages): a token must grant every key."""
        if self._draining.active:
            raise Unavailable("the server is shutting down; retry on a new connection")
        if self._authority is not None:
            self._authority.check_server_wide(context.invocation_metadata() or (), what)


def _row_stat_bytes(message_id: str, role: str) -> int:
    """An upper bound on one RowStat's bytes in a frame: its texts, two integers, tags and lengths."""
    return framing.json_bytes(message_id) + framing.json_bytes(role) + 40


def _policy(policy: Policy) -> pb.CompactionPolicy:
    return pb.CompactionPolicy(threshold_tokens=policy.threshold_tokens, keep_recent_tokens=policy.keep_recent_tokens)


async def _responses(
    windows: AsyncIterator[list[MessageView]],
    max_messages: int,
    make: Callable[[], Resp],
    batches: BatchMarker | None = None,
) -> AsyncGenerator[tuple[Resp | bytes, bool], None]:
    """The responses of a message read, window by window, with whether each ends a batch: a
    window is framed as soon as it is read, so nothing waits on the next read."""
    async for window in windows:
        if batches is None:
            for response in framing.window_responses(window, max_messages, make):
                yield response, False
            continue
        for item in framing.framed_responses(batches.mark(window), max_messages, make):
            yield item
    if batches is not None:
        for item in framing.framed_responses(batches.finish(), max_messages, make):
            yield item


# An export holds a copy of its object's file in scratch until its last frame is taken: a
# client that stopped reading kept it there for as long as its connection lived (5 stalled
# exports of a 40 MB object: 193 MiB, still held 75 s later). 60 s a frame of 3 MiB asks for
# 50 KB/s at least.
EXPORT_IDLE_SECONDS = 60.0


def _export_stalled() -> SessionsError:
    return exceeded(
        "the export's next frame was not taken in time; its copy of the object was dropped",
        "export_idle_seconds",
        int(EXPORT_IDLE_SECONDS),
        "s",
    )
