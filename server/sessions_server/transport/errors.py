"""Maps domain errors to gRPC statuses with google.rpc.Status details and an ErrorInfo."""

from __future__ import annotations

import logging

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from sessions_server.domain import errors

ERROR_DOMAIN = "sessions.v1"
log = logging.getLogger("sessions.transport")

# A status travels in trailers, its message twice (grpc-message, percent-encoded, and inside
# grpc-status-details-bin), and clients drop a call whose metadata passes 8-16 KiB: the caller
# would get "metadata size exceeds limit" instead of the error. Messages that quote a caller's
# value (an object key of any length, say) are cut to these UTF-8 sizes.
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_VALUE_BYTES = 256

_CODES: dict[type[errors.SessionsError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.LimitExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.StorageFailure: grpc.StatusCode.UNAVAILABLE,
    # Not UNAVAILABLE: retry policies (gRPC's, Envoy's, a mesh's) try that again, and alerting
    # files it with drains and restarts; a damaged file stays damaged until an operator acts.
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,
}


def status_for(exc: errors.SessionsError) -> grpc.Status:
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), grpc.StatusCode.INVALID_ARGUMENT)
    metadata = {key: _cut(value, MAX_METADATA_VALUE_BYTES) for key, value in exc.metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=ERROR_DOMAIN, metadata=metadata)
    details = [_packed(info)]
    if code == grpc.StatusCode.INVALID_ARGUMENT and "field" in metadata:
        # What generic gRPC tooling reads for a bad field (AIP-193), beside the ErrorInfo.
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=metadata["field"], description=metadata.get("detail") or _cut(exc.message, MAX_METADATA_VALUE_BYTES)
        )
        details.append(_packed(error_details_pb2.BadRequest(field_violations=[violation])))
    message = _cut(exc.message, MAX_MESSAGE_BYTES)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=details))


def _packed(detail: error_details_pb2.ErrorInfo | error_details_pb2.BadRequest) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(detail)
    return packed


def _cut(text: str, limit: int) -> str:
    """`text` if its UTF-8 fits `limit` bytes, else its longest prefix that does, marked cut."""
    if len(text) <= limit // 4:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")  # a character cut in two is left out
    return f"{kept}... ({len(data) - limit} more bytes)"


def internal_status(exc: BaseException) -> grpc.Status:
    log.exception("internal error", exc_info=exc)
    info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=ERROR_DOMAIN)
    return rpc_status.to_status(
        status_pb2.Status(
            code=grpc.StatusCode.INTERNAL.value[0],
            message=f"internal error: {type(exc).__name__}",
            details=[_packed(info)],
        )
    )
