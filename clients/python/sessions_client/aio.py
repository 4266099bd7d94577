"""The asyncio client: the same handles and method names as the blocking client, as coroutines
(writes, point reads) and async iterators (history)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc
import grpc.aio

from sessions_client._common import (
    AUTO,
    KEEPALIVE_SECONDS,
    KEEPALIVE_TIMEOUT_SECONDS,
    PACKED_MESSAGES,
    SEARCH_HITS_PER_RESPONSE,
    UNARY_LIMIT_BYTES,
    AppendResult,
    AsyncMirror,
    Attachment,
    ChangeEvent,
    ClientClosed,
    CompactionPlan,
    CompactionPolicy,
    CompactionRecord,
    Connection,
    EventAssembler,
    FrameAssembler,
    FramesEachAttempt,
    ImportItem,
    ImportResult,
    Message,
    MessageDecoder,
    MessageWithInfo,
    ObjectStats,
    ParentArg,
    RecentHistory,
    RowStat,
    SearchResult,
    SentFramesAsync,
    SessionsError,
    TlsConfig,
    UpsertResult,
    VacuumReport,
    attachment_mode,
    channel_closed_error,
    channel_options,
    closed_error,
    collect_search,
    frames_of,
    history_request,
    import_frames,
    import_frames_async,
    import_result,
    is_blank,
    json_size,
    loads_json,
    parent_fields,
    parent_of,
    routing_metadata,
    search_mode,
    source_value,
    summary_of,
    summary_refused,
    to_json,
    upload_frames,
    written_json_in_hand,
)
from sessions_client._retry import (
    DEFAULT_RETRY_POLICY,
    Attempts,
    CallOptions,
    RetryNotice,
    RetryPolicy,
    closed_before_http2,
    may_resubscribe,
    resubscribe_delay,
)
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc

__all__ = ["ObjectHandle", "SessionHandle", "SessionsClient"]


class SessionsClient(CallOptions):
    """An asyncio connection to a Sessions server. Use `async with`, or `await close()`."""

    def __init__(
        self,
        target: str,
        *,
        channel: grpc.aio.Channel | None = None,
        options: Sequence[tuple[str, Any]] = (),
        timeout: float | None = None,
        token: str | None = None,
        tls: TlsConfig | None = None,
        keepalive_seconds: float | None = KEEPALIVE_SECONDS,
        keepalive_timeout_seconds: float = KEEPALIVE_TIMEOUT_SECONDS,
        retry: RetryPolicy | None = DEFAULT_RETRY_POLICY,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        """As the sync client's: `timeout` bounds each call, its retries included (not
        `subscribe`); `retry` and `on_retry` decide and report when a failed call is tried again."""
        self.timeout = timeout  # checked before a channel is made that nothing would close
        self._owns_channel = channel is None  # a channel passed in is the caller's to close
        # How its own channel speaks (TLS or plaintext); None for a channel passed in.
        self._own_channel_tls: bool | None = None if channel is not None else tls is not None
        if channel is None:
            chosen = channel_options(options, keepalive_seconds, keepalive_timeout_seconds)
            channel = (
                grpc.aio.secure_channel(target, tls.credentials(), options=chosen)
                if tls is not None
                else grpc.aio.insecure_channel(target, options=chosen)
            )
        self._channel = channel
        self._connection = Connection()
        self._token = token
        self._stub = pb_grpc.SessionServiceStub(self._channel)
        self.retry = retry
        self.on_retry = on_retry

    async def __aenter__(self) -> SessionsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """As the sync client's: does nothing on a view; a channel passed in stays open."""
        if self._is_view:
            return
        self._connection.close()
        if self._owns_channel:
            await self._channel.close(None)

    def object(self, object_key: str) -> ObjectHandle:
        return ObjectHandle(self, object_key)

    async def _call(self, object_key: str, method: str, request: Any, *, once: bool = False) -> Any:
        """A unary or client-streaming call, tried again as `retry` allows. `request` may be a
        function making the request, for requests (iterators of frames) that are used up;
        `once`: never tried again (frames from the caller's iterator, which cannot be replayed)."""
        fn = getattr(self._stub, method)
        attempts = Attempts(method, None if once else self.retry, self.on_retry, self.timeout)
        while True:
            attempts.begin()
            if self._connection.closed:
                raise closed_error()
            sent = request() if callable(request) else request
            try:
                return await fn(sent, metadata=routing_metadata(object_key, self._token), timeout=attempts.remaining())
            except grpc.aio.UsageError:  # a channel passed in, closed by its owner
                raise self._closed_channel() from None
            except grpc.RpcError as error:
                failure = self._failure(error)
                delay = attempts.wait_after(failure)
                if delay is None:
                    raise failure from None
            except asyncio.CancelledError:
                self._raise_if_closed()
                raise
            await self._connection.pause_async(delay)

    def _failure(self, error: grpc.RpcError) -> SessionsError:
        if self._connection.closed:
            return closed_error()
        failure = SessionsError.from_rpc_error(error)
        return failure if self._own_channel_tls is None else closed_before_http2(failure, tls=self._own_channel_tls)

    def _closed_channel(self) -> SessionsError:
        return closed_error() if self._connection.closed else channel_closed_error()

    def _raise_if_closed(self) -> None:
        """A call the client's close cut ends with CancelledError in a task nobody cancelled:
        raised as the close instead (a cancelled task's own cancellation goes on as it is)."""
        task = asyncio.current_task()
        if self._connection.closed and (task is None or not task.cancelling()):
            raise closed_error() from None

    async def _stream(self, object_key: str, method: str, request: Any, *, endless: bool = False) -> AsyncIterator[Any]:
        """A server stream, tried again as `retry` allows while it has delivered nothing.
        `endless` (a change feed): runs until closed, whatever the client's timeout."""
        fn = getattr(self._stub, method)
        attempts = Attempts(method, self.retry, self.on_retry, None if endless else self.timeout)
        while True:
            attempts.begin()
            if self._connection.closed:
                raise closed_error()
            try:
                call = fn(request, metadata=routing_metadata(object_key, self._token), timeout=attempts.remaining())
            except grpc.aio.UsageError:  # a channel passed in, closed by its owner
                raise self._closed_channel() from None
            delivered = False
            try:
                async for response in call:
                    delivered = True
                    yield response
                return
            except grpc.aio.UsageError:
                raise self._closed_channel() from None
            except grpc.RpcError as error:
                failure = self._failure(error)
                delay = None if delivered else attempts.wait_after(failure)
                if delay is None:
                    raise failure from None
            except asyncio.CancelledError:
                self._raise_if_closed()
                raise
            finally:
                call.cancel()  # stops the server's reads when the caller breaks off early
            await self._connection.pause_async(delay)


class ObjectHandle:
    """One object (an isolated store) on the server."""

    def __init__(self, client: SessionsClient, object_key: str) -> None:
        self.client = client
        self.key = object_key

    def session(self, session_id: str = "") -> SessionHandle:
        return SessionHandle(self, session_id)

    async def subscribe(
        self,
        *,
        session_id: str | None = None,
        resume_from: int | None = None,
        pointers: bool = False,
        include_progress: bool = False,
        reconnect_attempts: int = 20,
    ) -> AsyncGenerator[ChangeEvent, None]:
        """The object's change events in commit order, reconnecting (and resuming) by itself
        across drains and restarts; a `reset` event means events were missed. `reconnect_attempts`:
        failed reconnections in a row before the error is raised; a stream that delivered more than
        what opens it (the PROGRESS, or a resume's RESET) ends a row."""
        last = resume_from or 0
        attempts = 0
        while True:
            request = pb.SubscribeRequest(
                object_key=self.key, resume_after_revision=last, attachments=attachment_mode(pointers)
            )
            if session_id is not None:
                request.session_id = session_id
            assembler = EventAssembler()
            acknowledged = False  # this stream delivered what opens it (the "subscribed")
            try:
                async for response in self.client._stream(self.key, "Subscribe", request, endless=True):
                    event = assembler.feed(response)
                    if event is None:
                        continue
                    if not acknowledged and event.type in ("progress", "reset"):
                        # A stream opens so (a resume that missed events, with the reset): no sign
                        # yet that it works.
                        acknowledged = True
                    else:
                        attempts = 0  # it worked: the next failure is the first in a row
                    last = event.revision
                    if event.type != "progress" or include_progress:
                        yield event
            except SessionsError as error:
                # The client or the channel closed by its owner: nothing to reconnect to.
                gone = self.client._connection.closed or isinstance(error, ClientClosed)
                if not may_resubscribe(error) or attempts >= reconnect_attempts or gone:
                    raise
                attempts += 1
                await self.client._connection.pause_async(resubscribe_delay(attempts))
                continue
            return

    async def read_attachment(self, digest: str) -> Attachment:
        request = pb.ReadAttachmentRequest(object_key=self.key, hash=digest)
        media_type, chunks, first = "", [], True
        async for response in self.client._stream(self.key, "ReadAttachment", request):
            if first:
                media_type, first = response.media_type, False
            chunks.append(response.data)
        return Attachment(digest, media_type, b"".join(chunks))

    async def list_sessions(self) -> list[tuple[str, int]]:
        sessions: list[tuple[str, int]] = []
        token = ""
        while True:
            request = pb.ListSessionsRequest(object_key=self.key, page_token=token)
            response = await self.client._call(self.key, "ListSessions", request)
            sessions.extend((s.session_id, int(s.message_count)) for s in response.sessions)
            token = response.next_page_token
            if not token:
                return sessions

    async def vacuum(self) -> VacuumReport:
        """Gives the disk back the room deletes freed in the object's file (`free_bytes`): the
        server rewrites it with the pages in use; its writes wait meanwhile. Tried again only
        when the server refused it before acting, as the other admin calls."""
        request = pb.VacuumObjectRequest(object_key=self.key)
        r = await self.client._call(self.key, "VacuumObject", request)
        return VacuumReport(int(r.file_bytes_before), int(r.file_bytes_after))

    async def get_object_stats(self) -> ObjectStats:
        request = pb.GetObjectStatsRequest(object_key=self.key)
        r = await self.client._call(self.key, "GetObjectStats", request)
        return ObjectStats(
            int(r.file_bytes),
            int(r.message_rows),
            int(r.continuation_rows),
            int(r.attachment_count),
            int(r.attachment_bytes),
            int(r.row_writes),
            int(r.session_count),
            int(r.free_bytes),
        )


class SessionHandle:
    """One session inside an object; messages are plain dicts."""

    def __init__(self, obj: ObjectHandle, session_id: str) -> None:
        self.object = obj
        self.id = session_id
        self._client = obj.client
        self._key = obj.key

    async def append_message(
        self, message: Message | str, *, parent_id: ParentArg = AUTO, source: str = "server"
    ) -> AppendResult:
        text = to_json(message)
        if json_size(text) > UNARY_LIMIT_BYTES:
            upload = await self._upload(pb.UPLOAD_OPERATION_APPEND, text, parent_id, source)
            return AppendResult(
                upload.inserted, await self._written_json(upload.message, text), parent_of(upload.message.info)
            )
        request = pb.AppendMessageRequest(
            object_key=self._key,
            session_id=self.id,
            message_json=text,
            source=source_value(source),
            omit_json_as_sent=True,
            **parent_fields(parent_id),
        )
        response = await self._client._call(self._key, "AppendMessage", request)
        return AppendResult(
            response.inserted, await self._written_json(response.message, text), parent_of(response.message.info)
        )

    async def append_messages(
        self, messages: Iterable[Message | str], *, parent_id: ParentArg = AUTO, source: str = "server"
    ) -> list[AppendResult]:
        texts = [to_json(message) for message in messages]
        items = []
        for index, text in enumerate(texts):
            fields = parent_fields(parent_id if index == 0 else AUTO)
            items.append(pb.AppendItem(message_json=text, source=source_value(source), **fields))
        request = pb.AppendMessagesRequest(
            object_key=self._key, session_id=self.id, items=items, omit_json_as_sent=True
        )
        response = await self._client._call(self._key, "AppendMessages", request)
        in_hand = [written_json_in_hand(r.message, text) for r, text in zip(response.results, texts, strict=True)]
        read_back = await self._read_back(
            [r.message.info.id for r, j in zip(response.results, in_hand, strict=True) if j is None]
        )
        return [
            AppendResult(r.inserted, read_back[r.message.info.id] if j is None else j, parent_of(r.message.info))
            for r, j in zip(response.results, in_hand, strict=True)
        ]

    async def update_message(self, message: Message | str, *, source: str = "server") -> Message | None:
        text = to_json(message)
        if json_size(text) > UNARY_LIMIT_BYTES:
            upload = await self._upload(pb.UPLOAD_OPERATION_UPDATE, text, AUTO, source)
            return await self._written(upload.message, text) if upload.found else None
        request = pb.UpdateMessageRequest(
            object_key=self._key,
            session_id=self.id,
            message_json=text,
            source=source_value(source),
            omit_json_as_sent=True,
        )
        response = await self._client._call(self._key, "UpdateMessage", request)
        return await self._written(response.message, text) if response.found else None

    async def upsert_message(
        self, message: Message | str, *, parent_id: ParentArg = AUTO, source: str = "server"
    ) -> UpsertResult:
        text = to_json(message)
        if json_size(text) > UNARY_LIMIT_BYTES:
            upload = await self._upload(pb.UPLOAD_OPERATION_UPSERT, text, parent_id, source)
            return UpsertResult(upload.inserted, upload.changed, await self._written_json(upload.message, text))
        request = pb.UpsertMessageRequest(
            object_key=self._key,
            session_id=self.id,
            message_json=text,
            source=source_value(source),
            omit_json_as_sent=True,
            **parent_fields(parent_id),
        )
        response = await self._client._call(self._key, "UpsertMessage", request)
        return UpsertResult(response.inserted, response.changed, await self._written_json(response.message, text))

    async def delete_messages(self, ids: Iterable[str]) -> int:
        request = pb.DeleteMessagesRequest(object_key=self._key, session_id=self.id, message_ids=list(ids))
        return int((await self._client._call(self._key, "DeleteMessages", request)).deleted_count)

    async def clear_messages(self) -> int:
        request = pb.ClearMessagesRequest(object_key=self._key, session_id=self.id)
        return int((await self._client._call(self._key, "ClearMessages", request)).deleted_count)

    async def import_message(self, message: Message | str, *, parent_id: str | None, created_at: Any = None) -> bool:
        return (await self.import_messages([ImportItem(message, parent_id, created_at)])).imported == 1

    async def import_messages(
        self, items: Iterable[ImportItem | Message] | AsyncIterable[ImportItem | Message]
    ) -> ImportResult:
        """Streams messages in; plain dicts chain, each parented to the previous one. A list or
        tuple goes packed (many messages a frame) and is sent again when the call is tried again
        (ids stored by an earlier attempt then count as skipped); an iterator, or an async
        iterable (another session's `history()`), a message at a time as it yields, and the call
        is not tried again (the iterator cannot be read twice)."""
        if isinstance(items, AsyncIterable):
            sent = SentFramesAsync(import_frames_async(self._key, self.id, items))
            try:
                response = await self._client._call(self._key, "ImportMessages", sent, once=True)
            except (SessionsError, asyncio.CancelledError):
                if not _cancelled_here():
                    sent.raise_failure()
                raise
            return import_result(response, iter(()))  # not counted against items in hand
        frames = FramesEachAttempt(lambda: import_frames(self._key, self.id, items))
        try:
            response = await self._client._call(
                self._key, "ImportMessages", frames, once=not isinstance(items, Sequence)
            )
        except (SessionsError, asyncio.CancelledError):
            if not _cancelled_here():
                frames.raise_failure()
            raise
        return import_result(response, items)

    async def get_message(self, message_id: str, *, pointers: bool = False) -> Message | None:
        request = pb.GetMessageRequest(
            object_key=self._key, session_id=self.id, message_id=message_id, attachments=attachment_mode(pointers)
        )
        found = await self._one_message("GetMessage", request)
        return None if found is None else found.message()

    async def get_messages(self, ids: Iterable[str], *, pointers: bool = False) -> list[Message | None]:
        wanted = list(ids)  # read once: an iterator gave the request its ids and the answer none
        request = pb.GetMessagesRequest(
            object_key=self._key,
            session_id=self.id,
            message_ids=wanted,
            attachments=attachment_mode(pointers),
            max_messages_per_response=PACKED_MESSAGES,
        )
        by_id = {m.info.id: m.message() async for m in self._messages("GetMessages", request)}
        return [by_id.get(i) for i in wanted]

    async def get_latest_leaf(self, *, pointers: bool = False) -> Message | None:
        request = pb.GetLatestLeafRequest(
            object_key=self._key, session_id=self.id, attachments=attachment_mode(pointers)
        )
        found = await self._one_message("GetLatestLeaf", request)
        return None if found is None else found.message()

    async def get_branches(self, message_id: str, *, pointers: bool = False) -> list[Message]:
        request = pb.GetBranchesRequest(
            object_key=self._key,
            session_id=self.id,
            message_id=message_id,
            attachments=attachment_mode(pointers),
            max_messages_per_response=PACKED_MESSAGES,
        )
        return [m.message() async for m in self._messages("GetBranches", request)]

    async def history(
        self,
        *,
        leaf_id: str | None = None,
        newest_first: bool = False,
        pointers: bool = False,
        limit: int | None = None,
    ) -> AsyncIterator[Message]:
        """Streams a path, as the synchronous client's `history`: an iterator kept in a variable
        holds the call open after a `break` until `await it.aclose()`, or until it is dropped."""
        request = history_request(self._key, self.id, leaf_id, newest_first, pointers, limit)
        decoder = MessageDecoder()
        async for response in self._client._stream(self._key, "StreamHistory", request):
            for message in decoder.messages(response):
                yield message
        decoder.finish()

    async def history_batches(
        self,
        *,
        batch_size: int = 50,
        max_batch_bytes: int = 4 * 1024 * 1024,
        leaf_id: str | None = None,
        newest_first: bool = False,
        pointers: bool = False,
        limit: int | None = None,
    ) -> AsyncIterator[list[Message]]:
        """A path in batches the server marks (`batch_size` messages, `max_batch_bytes` of JSON;
        a larger message is a batch alone). `limit`: at most that many messages, as `history`."""
        request = history_request(self._key, self.id, leaf_id, newest_first, pointers, limit)
        request.batch_size = max(1, int(batch_size))
        request.max_batch_bytes = max(1, int(max_batch_bytes))
        batch: list[Message] = []
        assembler = FrameAssembler()
        async for response in self._client._stream(self._key, "StreamHistory", request):
            for frame in frames_of(response):
                done = assembler.feed(frame)
                if done is not None:
                    batch.append(done.message())
            if response.batch_end:
                yield batch
                batch = []
        assembler.finish()
        if batch:
            yield batch

    async def mirror(self) -> AsyncMirror:
        """A local copy of this session's messages, and the feed revision it is current at; keep
        it in sync with the object's events after that revision: `async for event in
        session.object.subscribe(session_id=session.id, resume_from=mirror.revision): await
        mirror.apply(event)`."""
        feed = self.object.subscribe(session_id=self.id, include_progress=True, reconnect_attempts=0)
        try:
            start = await anext(feed)  # a live feed opens with the revision after which everything follows
        finally:
            await feed.aclose()
        mirror = AsyncMirror(self.id, self.get_history, start.revision)
        mirror.messages = await self.get_history()  # read after that revision: nothing before it is missed
        return mirror

    async def get_history(
        self,
        *,
        leaf_id: str | None = None,
        newest_first: bool = False,
        pointers: bool = False,
        limit: int | None = None,
    ) -> list[Message]:
        request = history_request(self._key, self.id, leaf_id, newest_first, pointers, limit)
        decoder = MessageDecoder()
        out: list[Message] = []
        async for response in self._client._stream(self._key, "StreamHistory", request):
            out.extend(decoder.messages(response))
        decoder.finish()
        return out

    async def get_recent_history(
        self, max_content_bytes: int, *, leaf_id: str | None = None, pointers: bool = False
    ) -> RecentHistory:
        request = pb.GetRecentHistoryRequest(
            object_key=self._key,
            session_id=self.id,
            max_content_bytes=int(max_content_bytes),
            leaf_id=leaf_id or "",
            attachments=attachment_mode(pointers),
            max_messages_per_response=PACKED_MESSAGES,
        )
        truncated, total = False, 0
        out: list[Message] = []
        assembler = FrameAssembler()
        async for response in self._client._stream(self._key, "GetRecentHistory", request):
            if response.HasField("summary"):
                truncated = response.summary.truncated
                total = response.summary.total_content_bytes
            for frame in frames_of(response):
                done = assembler.feed(frame)
                if done is not None:
                    out.append(done.message())
        assembler.finish()
        return RecentHistory(out, truncated, int(total))

    async def get_history_row_stats(self, *, leaf_id: str | None = None) -> list[RowStat]:
        request = pb.GetHistoryRowStatsRequest(object_key=self._key, session_id=self.id, leaf_id=leaf_id or "")
        return [
            RowStat(s.id, s.role, int(s.bytes), int(s.token_estimate))
            async for response in self._client._stream(self._key, "GetHistoryRowStats", request)
            for s in response.stats
        ]

    async def add_compaction(
        self,
        summary: str,
        from_message_id: str,
        to_message_id: str,
        *,
        from_compact: bool = False,
        plan_token: str = "",
    ) -> CompactionRecord:
        """Stores an overlay. `plan_token`, a plan's (`plan_compaction`): the summary is refused
        (SESSION_CHANGED, nothing stored) if what it was made of changed since that plan."""
        request = pb.AddCompactionRequest(
            object_key=self._key,
            session_id=self.id,
            summary=summary,
            from_message_id=from_message_id,
            to_message_id=to_message_id,
            from_compact=from_compact,
            plan_token=plan_token,
        )
        return CompactionRecord.of((await self._client._call(self._key, "AddCompaction", request)).compaction)

    async def list_compactions(self) -> list[CompactionRecord]:
        records: list[CompactionRecord] = []
        token = ""
        while True:
            request = pb.ListCompactionsRequest(object_key=self._key, session_id=self.id, page_token=token)
            response = await self._client._call(self._key, "ListCompactions", request)
            records.extend(CompactionRecord.of(record) for record in response.compactions)
            token = response.next_page_token
            if not token:
                return records

    async def plan_compaction(
        self, *, leaf_id: str | None = None, keep_recent_tokens: int = 0
    ) -> CompactionPlan | None:
        request = pb.PlanCompactionRequest(
            object_key=self._key, session_id=self.id, leaf_id=leaf_id or "", keep_recent_tokens=keep_recent_tokens
        )
        return CompactionPlan.of(await self._client._call(self._key, "PlanCompaction", request))

    async def compact(
        self,
        summarize: Callable[[str], Awaitable[str]] | None = None,
        *,
        leaf_id: str | None = None,
        keep_recent_tokens: int = 0,
    ) -> CompactionRecord | None:
        """With `summarize` (a coroutine function), plans, summarizes here and stores the overlay;
        without, the server's summarizer does the work. `keep_recent_tokens` as the sync client's."""
        if summarize is None:
            request = pb.CompactRequest(
                object_key=self._key, session_id=self.id, leaf_id=leaf_id or "", keep_recent_tokens=keep_recent_tokens
            )
            response = await self._client._call(self._key, "Compact", request)
            return CompactionRecord.of(response.compaction) if response.compacted else None
        attempt = 0
        while True:
            plan = await self.plan_compaction(leaf_id=leaf_id, keep_recent_tokens=keep_recent_tokens)
            if plan is None:
                return None
            summary = summary_of(await summarize(plan.prompt))
            if is_blank(summary):
                return None
            try:
                return await self.add_compaction(
                    summary, plan.from_message_id, plan.to_message_id, from_compact=True, plan_token=plan.plan_token
                )
            except SessionsError as error:
                if not summary_refused(error, attempt):
                    raise
            attempt += 1

    async def set_compaction_policy(self, threshold_tokens: int, *, keep_recent_tokens: int = 0) -> CompactionPolicy:
        request = pb.SetCompactionPolicyRequest(
            object_key=self._key,
            session_id=self.id,
            policy=pb.CompactionPolicy(threshold_tokens=threshold_tokens, keep_recent_tokens=keep_recent_tokens),
        )
        policy = (await self._client._call(self._key, "SetCompactionPolicy", request)).policy
        return CompactionPolicy(int(policy.threshold_tokens), int(policy.keep_recent_tokens))

    async def get_compaction_policy(self) -> CompactionPolicy:
        request = pb.GetCompactionPolicyRequest(object_key=self._key, session_id=self.id)
        policy = (await self._client._call(self._key, "GetCompactionPolicy", request)).policy
        return CompactionPolicy(int(policy.threshold_tokens), int(policy.keep_recent_tokens))

    async def search(
        self, query: str, *, limit: int = 20, mode: str = "phrase", all_sessions: bool = False
    ) -> list[SearchResult]:
        request = pb.SearchMessagesRequest(
            object_key=self._key,
            session_id=self.id,
            query=query,
            limit=limit,
            mode=search_mode(mode),
            all_sessions=all_sessions,
            max_hits_per_response=SEARCH_HITS_PER_RESPONSE,
        )
        responses = [r async for r in self._client._stream(self._key, "SearchMessages", request)]
        return collect_search(responses)

    async def _messages(self, method: str, request: Any) -> AsyncIterator[MessageWithInfo]:
        assembler = FrameAssembler()
        async for response in self._client._stream(self._key, method, request):
            for frame in frames_of(response):
                done = assembler.feed(frame)
                if done is not None:
                    yield done
        assembler.finish()

    async def _one_message(self, method: str, request: Any) -> MessageWithInfo | None:
        """The message of a read that answers one at most (GetMessage, GetLatestLeaf), read to
        the stream's end: a call left after its message was cancelled as its status came, and
        the server counted a read that succeeded as CANCELLED."""
        found = None
        async for message in self._messages(method, request):
            if found is None:
                found = message
        return found

    async def _read_back(self, ids: list[str]) -> dict[str, str]:
        """Stored JSON the server left out of a batch's answer (no room), in one read."""
        if not ids:
            return {}
        request = pb.GetMessagesRequest(
            object_key=self._key, session_id=self.id, message_ids=ids, max_messages_per_response=PACKED_MESSAGES
        )
        found = {m.info.id: m.json async for m in self._messages("GetMessages", request)}
        if len(found) < len(set(ids)):
            raise SessionsError(
                grpc.StatusCode.NOT_FOUND, "written messages vanished before they were read back", None, {}
            )
        return found

    async def _written(self, written: pb.WrittenMessage, sent: str) -> Message:
        return loads_json(await self._written_json(written, sent))  # type: ignore[no-any-return]

    async def _written_json(self, written: pb.WrittenMessage, sent: str) -> str:
        """The written message's JSON: in hand (`written_json_in_hand`), else read back."""
        in_hand = written_json_in_hand(written, sent)
        if in_hand is not None:
            return in_hand
        request = pb.GetMessageRequest(object_key=self._key, session_id=self.id, message_id=written.info.id)
        found = await self._one_message("GetMessage", request)
        if found is not None:
            return found.json
        raise SessionsError(grpc.StatusCode.NOT_FOUND, "written message vanished before it was read back", None, {})

    async def _upload(
        self, operation: pb.UploadOperation.ValueType, text: str, parent_id: ParentArg, source: str
    ) -> pb.UploadMessageResponse:
        header = pb.UploadHeader(
            object_key=self._key,
            session_id=self.id,
            operation=operation,
            source=source_value(source),
            **parent_fields(parent_id),
        )
        frames = FramesEachAttempt(lambda: upload_frames(header, text))
        try:
            response: pb.UploadMessageResponse = await self._client._call(self._key, "UploadMessage", frames)
        except (SessionsError, asyncio.CancelledError):
            if not _cancelled_here():
                frames.raise_failure()  # text UTF-8 cannot carry: raised as a small write's is
            raise
        return response


def _cancelled_here() -> bool:
    """Whether this task is being cancelled: else a CancelledError out of a call is grpc.aio's
    way of ending a call whose request frames failed to be made."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
