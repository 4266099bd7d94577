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

_CODES: dict[type[errors.SessionsError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.LimitExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.StorageFailure: grpc.StatusCode.UNAVAILABLE,
}


def status_for(exc: errors.SessionsError) -> grpc.Status:
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), grpc.StatusCode.INVALID_ARGUMENT)
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=ERROR_DOMAIN, metadata=exc.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=exc.message, details=[detail]))


def internal_status(exc: BaseException) -> grpc.Status:
    log.exception("internal error", exc_info=exc)
    info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=ERROR_DOMAIN)
    detail = any_pb2.Any()
    detail.Pack(info)
    return rpc_status.to_status(
        status_pb2.Status(
            code=grpc.StatusCode.INTERNAL.value[0],
            message=f"internal error: {type(exc).__name__}",
            details=[detail],
        )
    )
