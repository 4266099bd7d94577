"""How a call runs, apart from what it does: its stream slot, its answer or refusal (domain
errors become statuses), and the bounds on a client that stalls, sending or reading.

The servicer hands each handler's work here as a `run` function: `unary`, `client_stream`
(uploads and imports), `stream` (server streams, written with `context.write`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]

from sessions_server.domain.errors import SessionsError
from sessions_server.domain.limits import busy, exceeded
from sessions_server.transport import framing
from sessions_server.transport.errors import internal_status, status_for
from sessions_server.transport.fair_share import Refusal, Shares

log = logging.getLogger("sessions.transport")
Resp = TypeVar("Resp")


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    status = status_for(exc) if isinstance(exc, SessionsError) else internal_status(exc)
    await context.abort(status.code, status.details, status.trailing_metadata)


def end_with(context: grpc.aio.ServicerContext[Any, Any], exc: SessionsError) -> None:
    """Sets the status a server stream ends with when its handler returns."""
    status = status_for(exc)
    context.set_code(status.code)
    context.set_details(status.details)
    context.set_trailing_metadata(status.trailing_metadata)


async def unary(context: Any, run: Callable[[], Awaitable[Resp]]) -> Resp:
    try:
        return await run()
    except SessionsError as exc:
        await abort(context, exc)
    except (grpc.aio.AbortError, grpc.aio.UsageError):
        raise
    except Exception as exc:
        await abort(context, exc)
    raise AssertionError("unreachable: abort raises")


# How long the next frame of an upload or import (of messages, or of an object's file) may take,
# the first one included: the call holds one of the stream slots, an import of messages its
# object's store (which cannot close meanwhile), and the pieces already received of a message
# their share of --max-assembly-bytes. A client that stalled, between messages as well as inside
# one, held them (and refused others' calls) forever.
PIECE_IDLE_SECONDS = 60.0


async def next_frame(frames: AsyncIterator[Any], context: Any, *, inside_message: bool = False) -> Any:
    """The next frame of a client stream (None at the stream's end), or a refusal once it takes
    longer than PIECE_IDLE_SECONDS. A stream its client cancelled, or whose deadline passed,
    ends in CancelledError, not as a stream whose client finished sending."""
    try:
        frame = await asyncio.wait_for(anext(frames, None), PIECE_IDLE_SECONDS)
    except TimeoutError:
        raise exceeded(
            "the next piece of the message did not arrive in time; the pieces received were dropped"
            if inside_message
            else "the stream's next frame did not arrive in time",
            "piece_idle_seconds",
            int(PIECE_IDLE_SECONDS),
            "s",
        ) from None
    except (grpc.aio.AbortError, grpc.aio.UsageError):
        raise
    except grpc.aio.BaseError as exc:  # the server stopped under the read: the call is cut off
        raise asyncio.CancelledError("the server stopped before the client finished sending") from exc
    if frame is None:
        await _not_cut_off(context)
    return frame


# gRPC ends a client stream's frames alike when the client finishes sending and when the call
# ends under it (cancelled by its client, its deadline passed, its connection lost, the server
# stopping), and cancels the handler's task only some turns of the loop later. A handler that
# went straight on to write what it had received (an upload whose pieces were all there, an
# import's messages so far) carried out a call its client had given up on, and a message cut
# short was answered INVALID_JSON; both were counted and logged so. At the end of the frames the
# response's headers go out, which gRPC refuses, or the wait for which it cancels, on a call that
# has ended: the handler learns which end it met before it acts on the frames.
async def _not_cut_off(context: Any) -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise asyncio.CancelledError("the call's deadline passed")
    try:
        await context.send_initial_metadata(())
    except Exception as exc:  # the call ended under the handler (the server stopping, say)
        raise asyncio.CancelledError("the call ended before its client finished sending") from exc


# How much of a refused client stream is read (and dropped) before the refusal is sent.
REFUSED_STREAM_DRAIN_SECONDS = 5.0
REFUSED_STREAM_DRAIN_BYTES = 32 * 1024 * 1024


async def client_stream(
    context: Any, frames: AsyncIterable[Any], run: Callable[[], Awaitable[Resp]], slots: StreamSlots
) -> Resp:
    """`unary` for a client stream, which takes one of the server's stream slots (a client can
    hold it open as long as a server stream), and whose refusal first waits for what the client
    is still sending (read and dropped, up to a bound). Sent while the client still sends, the
    refusal ends the stream with a reset, which a proxy may pass on without the status (HAProxy
    2.6: CANCELLED, the reason lost), where the caller should learn why (LIMIT_EXCEEDED,
    DRAINING)."""
    try:
        with slots.take(context):
            return await run()
    except (grpc.aio.AbortError, grpc.aio.UsageError):
        raise
    except Exception as exc:
        await _drop_the_rest(frames)
        await abort(context, exc)
    raise AssertionError("unreachable: abort raises")


async def _drop_the_rest(frames: AsyncIterable[Any]) -> None:
    received = 0
    with contextlib.suppress(Exception):  # the client gone, the bound passed: answer anyway
        async with asyncio.timeout(REFUSED_STREAM_DRAIN_SECONDS):
            async for frame in frames:
                received += frame.ByteSize()
                if received > REFUSED_STREAM_DRAIN_BYTES:
                    return


class StreamSlots:
    """Counts concurrent streaming calls against `max_concurrent_streams`, and, with tokens,
    each token's against `max_streams_per_token` and its fair share of the server's slots
    (fair_share.py): idle feeds and unread reads of a few tenants took every slot, and every
    other tenant's reads were refused. Without tokens, the slots go first come, first served."""

    def __init__(
        self,
        limit: int,
        *,
        per_token: int = 0,
        token_of: Callable[[Iterable[tuple[str, str | bytes]]], str | None] | None = None,
    ) -> None:
        self.limit = limit
        self._per_token = per_token
        self._token_of = token_of
        self._shares = Shares(limit)

    @property
    def active(self) -> int:
        return self._shares.held

    @contextlib.contextmanager
    def take(self, context: Any) -> Iterator[None]:
        token = None
        if self._token_of is not None:
            token = self._token_of(context.invocation_metadata() or ())
        self._refuse(token)
        self._shares.take(token, 1)
        try:
            yield
        finally:
            self._shares.give_back(token, 1)

    def _refuse(self, token: str | None) -> None:
        """Raises the refusal of one more stream for `token`, if it gets one."""
        if token is None:
            if self._shares.held >= self.limit:
                raise exceeded("too many concurrent streams on this server", "max_concurrent_streams", self.limit)
            return
        holding = self._shares.of(token)
        if self._per_token and holding >= self._per_token:
            raise exceeded(
                "too many concurrent streams for this token (end some of its feeds or reads)",
                "max_streams_per_token",
                self._per_token,
            )
        refusal = self._shares.refusal(token, 1)
        if refusal is Refusal.OVER_SHARE:
            # Its share shrinks as others take slots and grows as they end theirs, as its own
            # reads end: for now (clients retry SERVER_BUSY), unlike its cap.
            raise busy(
                f"this token holds {holding} streams, its share while other callers hold the server's "
                "streams too; retry shortly, or end some of its feeds or reads",
                "max_concurrent_streams",
                self.limit,
            )
        if refusal is Refusal.BUSY:
            # Others' streams: not this caller's doing, and they end (clients retry SERVER_BUSY).
            raise busy(
                "the server's streams are taken by other callers; retry shortly "
                f"(max_concurrent_streams: {self.limit})",
                "max_concurrent_streams",
                self.limit,
            )


# What a write to a stream raises when gRPC could not send: the call ended under it (the client
# cancelled while the write waited for room, and the context does not always say cancelled yet),
# or the response passed the send limit.
_SendFailed: type[Exception] = cygrpc.ExecuteBatchError


@dataclass(frozen=True)
class TakenWithin:
    """How long a stream's client may leave a response untaken before the stream is ended, and
    the refusal it then gets."""

    seconds: float
    refusal: Callable[[], SessionsError]


class _Stall:
    """Ends the call's task (as a client's cancellation would: every `finally` runs) when a
    write waits longer than the reader's bound for the client to take it. A write cannot be
    given a deadline of its own: `asyncio.wait_for` around it never returned. A write that
    completes in the very loop pass the alarm rings is refused all the same, at the bound."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self.ended = False

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None
        alarm = asyncio.get_running_loop().call_later(self._seconds, self._end, task)
        try:
            yield
        finally:
            alarm.cancel()

    def _end(self, task: asyncio.Task[Any]) -> None:
        self.ended = True
        task.cancel()


async def stream(
    context: Any,
    run: Callable[[], AsyncIterator[Resp]],
    slots: StreamSlots,
    *,
    still_granted: Callable[[], None],
    taken_within: TakenWithin | None = None,
) -> None:
    """Writes a server stream with `context.write`. Written as a coroutine (not a generator) so a
    client's cancellation or deadline raises inside it at once and every `finally` runs: the read
    stops, its connection and its hold on the object are released. `still_granted` runs before
    each response is written and raises (ending the stream with its refusal) once the caller's
    token no longer grants the call: a read opened before a reload that revoked it went on
    sending, later windows included, which show what was written after the revocation.
    `taken_within`: the stream is ended, refused, when a response waits longer for its client."""
    iterator = run()
    stall = _Stall(taken_within.seconds) if taken_within is not None else None
    sending: Any = None
    try:
        with slots.take(context):
            try:
                if stall is not None:
                    # The headers first, alone: a first write the stall cuts short leaves gRPC
                    # believing them unsent, and the refusal sent them again, which gRPC's core
                    # refuses (logged as an ERROR, and the client never learnt the call's end).
                    await context.send_initial_metadata(())
                async with contextlib.aclosing(iterator):  # type: ignore[type-var]
                    async for sending in iterator:
                        still_granted()
                        if stall is None:
                            await context.write(sending)
                            continue
                        with stall.watching():
                            await context.write(sending)
            except asyncio.CancelledError:
                if stall is None or not stall.ended or taken_within is None:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]  # our own cancellation, handled here
                # Refused within its slot: the status waits behind the frame the client has not
                # taken, and until the client reads or leaves, the call counts against the
                # stream bounds as any open stream does (outside, stalled calls escaped them).
                await abort(context, taken_within.refusal())
    except SessionsError as exc:
        end_with(context, exc)
        return
    except (grpc.aio.AbortError, grpc.aio.UsageError):
        raise
    except Exception as exc:
        if isinstance(exc, _SendFailed) and _size(sending) > framing.RESPONSE_LIMIT_BYTES:
            # Our framing's fault, not the client's: gRPC ended the call (RESOURCE_EXHAUSTED).
            log.error("a response of %d bytes passed a frame's limit, and its call failed", _size(sending))
            raise asyncio.CancelledError from exc
        if context.cancelled() or context.done() or isinstance(exc, _SendFailed):
            # The call is over: the client went away mid-write. Ending as cancelled keeps gRPC
            # from sending a status it can no longer send (a failed first write leaves it
            # believing the headers unsent, and it logged the refused batch as an ERROR).
            raise asyncio.CancelledError from exc
        await abort(context, exc)


def _size(response: Any) -> int:
    if response is None:
        return 0
    return len(response) if isinstance(response, bytes) else int(response.ByteSize())
