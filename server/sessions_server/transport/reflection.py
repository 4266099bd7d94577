"""Server reflection that serves the contract with its comments.

grpcio-reflection rebuilds file descriptors from the runtime pool, which keeps no source info, so
`grpcurl describe` would show no documentation. This servicer answers from the descriptor set
built with source info (`sessions_descriptor.binpb`, generated from proto/), and also resolves
method names (`sessions.v1.SessionService.AppendMessage`), which the stock servicer does not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

SERVICE_NAME = "grpc.reflection.v1alpha.ServerReflection"


def _contract() -> descriptor_pb2.FileDescriptorSet:
    data = resources.files("sessions_proto.v1").joinpath("sessions_descriptor.binpb").read_bytes()
    return descriptor_pb2.FileDescriptorSet.FromString(data)


class ReflectionServicer(reflection_pb2_grpc.ServerReflectionServicer):  # type: ignore[misc]
    """grpc.reflection.v1alpha over the contract (with comments), health and reflection."""

    def __init__(self, service_names: tuple[str, ...]) -> None:
        self._services = tuple(sorted(service_names))
        self._files: dict[str, bytes] = {}
        self._pool = descriptor_pool.DescriptorPool()
        # The error details every failure carries (google.rpc.ErrorInfo in grpc-status-details-bin)
        # too: without them grpcurl prints "google.rpc.ErrorInfo is not recognized" for each.
        for module in (duration_pb2, any_pb2, status_pb2, error_details_pb2, health_pb2, reflection_pb2):
            proto = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
            self._add(proto)
        for proto in _contract().file:
            self._add(proto)

    def _add(self, proto: descriptor_pb2.FileDescriptorProto) -> None:
        if proto.name in self._files:
            return
        self._pool.Add(proto)
        self._files[proto.name] = proto.SerializeToString()

    def _with_dependencies(self, name: str) -> list[bytes]:
        out: list[bytes] = []
        seen: set[str] = set()

        def visit(file_name: str) -> None:
            if file_name in seen or file_name not in self._files:
                return
            seen.add(file_name)
            out.append(self._files[file_name])
            for dependency in self._pool.FindFileByName(file_name).dependencies:
                visit(dependency.name)

        visit(name)
        return out

    def _file_of_symbol(self, symbol: str) -> str | None:
        for candidate in (symbol, symbol.rpartition(".")[0]):  # a method resolves to its service's file
            if not candidate:
                continue
            try:
                return str(self._pool.FindFileContainingSymbol(candidate).name)
            except KeyError:
                continue
        return None

    def _answer(self, request: reflection_pb2.ServerReflectionRequest) -> reflection_pb2.ServerReflectionResponse:
        response = reflection_pb2.ServerReflectionResponse(valid_host=request.host, original_request=request)
        kind = request.WhichOneof("message_request")
        file_name: str | None = None
        if kind == "list_services":
            response.list_services_response.service.extend(
                reflection_pb2.ServiceResponse(name=name) for name in self._services
            )
            return response
        if kind == "file_by_filename":
            file_name = request.file_by_filename if request.file_by_filename in self._files else None
        elif kind == "file_containing_symbol":
            file_name = self._file_of_symbol(request.file_containing_symbol)
        if file_name is None:
            response.error_response.error_code = grpc.StatusCode.NOT_FOUND.value[0]
            response.error_response.error_message = "not found"
            return response
        response.file_descriptor_response.file_descriptor_proto.extend(self._with_dependencies(file_name))
        return response

    async def ServerReflectionInfo(
        self, request_iterator: AsyncIterator[reflection_pb2.ServerReflectionRequest], context: Any
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        async for request in request_iterator:
            yield self._answer(request)
