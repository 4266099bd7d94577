"""Registers the servicer with request decoding that never blames the server for bad bytes.

Stock generated registration lets a request that fails to decode (e.g. a string field holding
invalid UTF-8) surface as UNKNOWN. Here each method decodes through a wrapper that turns such a
request into a marker, and the handler answers INVALID_ARGUMENT with an ErrorInfo instead.

Every service, ours and the stock ones, registers through a `WrappingRegistrar`, which wraps each
method's handler once (metering, the reflection guard) where grpc would otherwise run
interceptors on every call.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import message as protobuf_message

from sessions_proto.v1 import sessions_pb2
from sessions_server.domain.errors import InvalidArgument, PermissionDenied, SessionsError
from sessions_server.transport import wire
from sessions_server.transport.auth import TokenAuthority
from sessions_server.transport.errors import status_for

OBJECT_KEY_HEADER = "x-object-key"

SERVICE = sessions_pb2.DESCRIPTOR.services_by_name["SessionService"]


class MalformedRequest:
    """Stands in for a request message that could not be decoded; `field`, the string field
    whose bytes are not UTF-8, when that is why."""

    def __init__(self, detail: str, field: str | None = None) -> None:
        self.detail = detail
        self.field = field

    def error(self) -> InvalidArgument:
        if self.field is not None:
            return InvalidArgument(
                f"the request could not be decoded: its {self.field} is not UTF-8 text, as a string field must be",
                reason="INVALID_FIELD",
                field=self.field,
            )
        return InvalidArgument(f"the request could not be decoded: {self.detail}", reason="INVALID_FIELD")


def _decoder(message_class: type[protobuf_message.Message]) -> Callable[[bytes], Any]:
    descriptor = message_class.DESCRIPTOR

    def decode(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except protobuf_message.DecodeError as exc:
            return MalformedRequest(str(exc), wire.undecodable_string_field(descriptor, data))

    return decode


def _encoder(message_class: type[protobuf_message.Message]) -> Callable[[Any], bytes]:
    serialize = message_class.SerializeToString

    def encode(response: Any) -> bytes:
        # Packed reads are encoded by the framing from per-message encodings it keeps.
        return response if type(response) is bytes else serialize(response)

    return encode


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, MalformedRequest):
            raise request.error()
        yield request


async def _abort_malformed(context: grpc.aio.ServicerContext[Any, Any], request: MalformedRequest) -> None:
    status = status_for(request.error())
    await context.abort(status.code, status.details, status.trailing_metadata)


def generic_handler(servicer: Any) -> grpc.GenericRpcHandler[Any, Any]:
    """A handler for every SessionService method of `servicer`."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in SERVICE.methods:
        request_class = sessions_pb2.__dict__[method.input_type.name]
        response_class = sessions_pb2.__dict__[method.output_type.name]
        behavior = getattr(servicer, method.name)
        decode = _decoder(request_class)
        encode = _encoder(response_class)
        if method.client_streaming:
            handlers[method.name] = _client_streaming(method, behavior, decode, encode)
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _server_stream_behavior(behavior), request_deserializer=decode, response_serializer=encode
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary_behavior(behavior), request_deserializer=decode, response_serializer=encode
            )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)


def _client_streaming(
    method: Any, behavior: Any, decode: Callable[[bytes], Any], encode: Callable[[Any], bytes]
) -> grpc.RpcMethodHandler[Any, Any]:
    async def run(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await behavior(_checked(requests), context)

    if method.server_streaming:
        raise TypeError("bidirectional methods are not part of the contract")
    return grpc.stream_unary_rpc_method_handler(run, request_deserializer=decode, response_serializer=encode)


def _unary_behavior(behavior: Any) -> Any:
    async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, MalformedRequest):
            await _abort_malformed(context, request)
        return await behavior(request, context)

    return run


def _server_stream_behavior(behavior: Any) -> Any:
    async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if isinstance(request, MalformedRequest):
            await _abort_malformed(context, request)
        await behavior(request, context)

    return run


HandlerWrap = Callable[[str, "grpc.RpcMethodHandler[Any, Any]"], "grpc.RpcMethodHandler[Any, Any]"]
# Looks at a call as it arrives (its method and metadata, before any request is read) and
# returns a handler that refuses it, or None to let it through.
CallScreen = Callable[[grpc.HandlerCallDetails], "grpc.RpcMethodHandler[Any, Any] | None"]


# The SessionService methods the servicer admits as writes (`_admit(..., write=True)`, or an
# admin call): tests/security checks the two agree, method by method.
WRITE_METHODS = frozenset(
    {
        "AppendMessage",
        "AppendMessages",
        "UpdateMessage",
        "UpsertMessage",
        "UploadMessage",
        "DeleteMessages",
        "ClearMessages",
        "ImportMessages",
        "AddCompaction",
        "Compact",
        "SetCompactionPolicy",
        "ExportObject",
        "ImportObject",
        "DeleteObject",
        "AbortMove",
        "VacuumObject",
    }
)


def refusing_unauthorized(authority: TokenAuthority) -> CallScreen:
    """A screen that refuses, before its request is read, a call whose bearer token is missing or
    unknown, a write by a token that may not write, and a call whose `x-object-key` header names
    a key the token may not use so. Checked in the handler, the token came after the whole
    request: a unary request is received whole first (up to --max-request-bytes), so anyone (or
    any read-only token) could make the server hold gigabytes, and a client stream was held
    open waiting for its first frame. The handler checks again, against the request's key."""

    def screen(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        metadata = details.invocation_metadata or ()
        try:
            grant = authority.authenticate(metadata)
            write = (details.method or "").rpartition("/")[2] in WRITE_METHODS
            header = next((value for key, value in metadata if key == OBJECT_KEY_HEADER), None)
            if header is not None:
                object_key = urllib.parse.unquote(header if isinstance(header, str) else header.decode())
                if not grant.allows(object_key, write):
                    authority.check(metadata, object_key, write=write)  # raises, worded as the handler's
            elif write and not grant.write:
                raise PermissionDenied(f"token {grant.name!r} may not write")
        except SessionsError as exc:
            status = status_for(exc)

            async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> None:
                await context.abort(status.code, status.details, status.trailing_metadata)

            # Taking the requests as a stream: grpc reads none of them before the refusal.
            return grpc.stream_unary_rpc_method_handler(refuse)
        return None

    return screen


class WrappingRegistrar:
    """Stands in for the server while services register (our own and stock ones: health,
    reflection): each method's handler goes through `wrap(full method name, handler)` once,
    before the server sees it, instead of through an interceptor on every call."""

    def __init__(self, server: grpc.aio.Server, wrap: HandlerWrap) -> None:
        self._server = server
        self._wrap = wrap

    def add_generic_rpc_handlers(
        self, generic_handlers: Sequence[grpc.GenericRpcHandler[Any, Any]], screen: CallScreen | None = None
    ) -> None:
        """`screen`, if given, sees each call to these handlers as it arrives."""
        wrapped = tuple(_WrappedLookup(handler, self._wrap, screen) for handler in generic_handlers)
        self._server.add_generic_rpc_handlers(wrapped)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        wrapped = {name: self._wrap(f"/{service}/{name}", handler) for name, handler in handlers.items()}
        self._server.add_registered_method_handlers(service, wrapped)  # type: ignore[attr-defined]  # not in the stubs


class _WrappedLookup(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """A generic handler whose handlers are wrapped on their first lookup and kept: the lookups
    registered here depend on the method name alone."""

    def __init__(
        self, inner: grpc.GenericRpcHandler[Any, Any], wrap: HandlerWrap, screen: CallScreen | None = None
    ) -> None:
        self._inner = inner
        self._wrap = wrap
        self._screen = screen
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method or ""
        handler = self._wrapped.get(method)
        if handler is None:
            found = self._inner.service(handler_call_details)
            if found is None:
                return None  # not kept: a client can ask for any name
            handler = self._wrapped[method] = self._wrap(method, found)
        if self._screen is not None:
            refusal = self._screen(handler_call_details)
            if refusal is not None:
                return self._wrap(method, refusal)  # counted as any call is
        return handler
