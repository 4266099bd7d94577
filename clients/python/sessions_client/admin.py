"""Operator tasks across servers: moving an object from one server to another."""

from __future__ import annotations

import contextlib
import itertools
import typing
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from sessions_client._common import SessionsError, routing_metadata
from sessions_client._sync import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb


@dataclass(frozen=True)
class MoveReport:
    object_key: str
    size_bytes: int
    message_rows: int
    sessions: list[tuple[str, int]]


def move_object(
    source: SessionsClient, destination: SessionsClient, object_key: str, *, destination_name: str = ""
) -> MoveReport:
    """Moves one object: locked snapshot from `source`, verified import into `destination`
    (digest, integrity, and the same sessions and row counts), then deletion at `source`.
    Writes to the object during the move get UNAVAILABLE (OBJECT_MOVING) and should be retried
    against the object's new owner. When a step before the deletion fails it raises
    SessionsError and leaves the source in place, its lock released (AbortMove) so it takes
    writes again at once."""
    metadata_source = routing_metadata(object_key, source._token)
    metadata_destination = routing_metadata(object_key, destination._token)
    export = source._stub.ExportObject(
        pb.ExportObjectRequest(object_key=object_key, lock_for_move=True), metadata=metadata_source
    )
    try:
        head = next(iter(export))  # the source's own refusal (not found, not owned) surfaces as itself
    except grpc.RpcError as error:
        raise SessionsError.from_rpc_error(error) from None

    def frames() -> Iterator[pb.ImportObjectRequest]:
        first = True
        for frame in itertools.chain([head], export):
            request = pb.ImportObjectRequest(data=frame.data, sha256=frame.sha256)
            if first:
                request.object_key = object_key
                request.replace = True
                first = False
            yield request

    try:
        try:
            imported = destination._stub.ImportObject(frames(), metadata=metadata_destination)
        except grpc.RpcError as error:
            raise SessionsError.from_rpc_error(error) from None
        # The source refuses writes since the snapshot, so its state now is what was copied.
        before = source.object(object_key).list_sessions()
        after = destination.object(object_key).list_sessions()
        if after != before or imported.message_rows != sum(count for _, count in before):
            raise SessionsError(
                grpc.StatusCode.DATA_LOSS,
                f"verification failed: source sessions {before}, destination {after}; the source was kept",
                "FAILED_PRECONDITION",
                {},
            )
    except SessionsError:
        typing.cast(typing.Any, export).cancel()  # a snapshot still being sent is dropped
        with contextlib.suppress(grpc.RpcError):  # best effort: else the lock lasts its lease
            source._stub.AbortMove(pb.AbortMoveRequest(object_key=object_key), metadata=metadata_source)
        raise
    try:
        source._stub.DeleteObject(
            pb.DeleteObjectRequest(object_key=object_key, moved_to=destination_name), metadata=metadata_source
        )
    except grpc.RpcError as error:
        raise SessionsError.from_rpc_error(error) from None
    return MoveReport(object_key, int(imported.size_bytes), int(imported.message_rows), after)
