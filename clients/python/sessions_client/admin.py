"""Operator tasks: moving an object from one server to another, sending a store file to one,
saving one's file, erasing one."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import sqlite3
import tempfile
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from sessions_client._common import FramesEachAttempt, SessionsError, routing_metadata
from sessions_client._retry import REFUSED_BEFORE_ACTING, Attempts, tls_failed
from sessions_client._sync import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb

_Answer = typing.TypeVar("_Answer")


@dataclass(frozen=True)
class MoveReport:
    object_key: str
    size_bytes: int
    message_rows: int
    sessions: list[tuple[str, int]]


@dataclass(frozen=True)
class ImportReport:
    object_key: str
    size_bytes: int
    message_rows: int


IMPORT_FRAME_BYTES = 3 * 1024 * 1024  # as the server's export frames: well under a message's 4 MiB


def _open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to `path`, escaped as a URI: a `?` or `#` in a file's name ended
    the path there, and SQLite opened (creating it, writable) the file named by what came before."""
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)


def import_file(
    destination: SessionsClient, object_key: str, path: str | Path, *, replace: bool = False
) -> ImportReport:
    """Sends a SQLite store file (upstream's, or a copy of one of ours) to a running server as
    `object_key` (ImportObject). A consistent copy is taken first with SQLite's backup API (it
    includes what the file's WAL holds, so a live file can be sent), then streamed with its
    SHA-256; the server checks the digest, the file's integrity and its limits before installing
    it, and installs nothing otherwise. A refusal before the server acted (a drain, a move's
    lock, a busy server) is tried again, the copy sent again, as `destination`'s retry policy
    allows; the call has no deadline. Raises SessionsError (FAILED_PRECONDITION when the
    object exists and `replace` is false; INVALID_ARGUMENT for a file that is not a usable
    store) and OSError when `path` cannot be read."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{source} is not a file")
    with tempfile.TemporaryDirectory(prefix="sessions-import-") as scratch:
        copy = Path(scratch) / "store.sqlite"
        try:
            with (
                contextlib.closing(_open_read_only(source)) as src,
                contextlib.closing(sqlite3.connect(copy)) as dst,
            ):
                src.backup(dst)
                dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file, no WAL beside it
        except sqlite3.DatabaseError as exc:
            raise SessionsError(
                grpc.StatusCode.INVALID_ARGUMENT, f"{source} is not a usable SQLite store: {exc}", None, {}
            ) from None
        digest = hashlib.sha256()
        with copy.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)

        def frames() -> Iterator[pb.ImportObjectRequest]:
            with copy.open("rb") as stream:
                request = pb.ImportObjectRequest(object_key=object_key, replace=replace)
                chunk = stream.read(IMPORT_FRAME_BYTES)
                while True:
                    request.data = chunk
                    chunk = stream.read(IMPORT_FRAME_BYTES)
                    if not chunk:  # the last frame carries the digest
                        request.sha256 = digest.hexdigest()
                        yield request
                        return
                    yield request
                    request = pb.ImportObjectRequest()

        # The copy is in hand: an attempt the server refused before acting (a drain, a move's
        # lock, a busy server) sends it again from its start, as the client's policy allows. A
        # failed connection is not retried: the file may have been installed (OBJECT_EXISTS then).
        attempt_frames = FramesEachAttempt(frames)
        try:
            imported = destination._call(object_key, "ImportObject", attempt_frames, endless=True)
        except SessionsError:
            attempt_frames.raise_failure()  # the copy failing to read, as itself
            raise
    return ImportReport(object_key, int(imported.size_bytes), int(imported.message_rows))


@dataclass(frozen=True)
class ExportReport:
    object_key: str
    path: Path
    size_bytes: int
    message_rows: int


def export_file(source: SessionsClient, object_key: str, path: str | Path, *, overwrite: bool = False) -> ExportReport:
    """Saves a consistent copy of an object's SQLite file (ExportObject, without a move lock: the
    object keeps taking writes) to `path`, which `import_file` or `import-store` take back, here
    or on another server. The copy is written beside `path` and renamed into place once its
    SHA-256 matches the server's, so `path` is never left half written. Raises FileExistsError
    when `path` exists and not `overwrite`, SessionsError (NOT_FOUND for an object the server
    does not hold; DATA_LOSS when the digest differs) and OSError when `path` cannot be written."""
    target = Path(path)
    if target.is_dir():  # found only at the rename, once the whole object had come
        raise IsADirectoryError(f"{target} is a directory: nothing was exported; give a file's path")
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists (overwrite it with overwrite=True, or --force)")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{target.parent} is not a directory: nothing was exported")
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(handle)
    partial = Path(name)
    export = None
    try:
        # Tried again as the client's policy allows until its first frame (a server busy with other
        # exports' copies refuses it as SERVER_BUSY); no deadline, however large the object.
        request = pb.ExportObjectRequest(object_key=object_key)
        export = source._stream(object_key, "ExportObject", request, endless=True)
        digest, size, expected = hashlib.sha256(), 0, ""
        with partial.open("wb") as out:
            for frame in export:
                out.write(frame.data)
                digest.update(frame.data)
                size += len(frame.data)
                expected = frame.sha256 or expected
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != expected:
            raise SessionsError(
                grpc.StatusCode.DATA_LOSS,
                f"the copy of {object_key!r} does not match the server's digest; nothing was saved",
                None,
                {},
            )
        with contextlib.closing(_open_read_only(partial)) as copy:
            rows = int(copy.execute("SELECT COUNT(*) FROM cf_agents_session_messages").fetchone()[0])
        partial.replace(target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename, not only the bytes, outlives a crash
        finally:
            os.close(directory)
    except BaseException:
        if export is not None:
            export.close()  # cancels the call
        partial.unlink(missing_ok=True)
        raise
    return ExportReport(object_key, target, size, rows)


MOVE_LEASE_SECONDS = 600
"""How long a move's lock outlives a mover that died without AbortMove; a lock that expires before
the move's DeleteObject makes the source refuse the delete (writes may have landed after the
snapshot), so it must cover sending, installing and checking the largest object."""


def move_object(
    source: SessionsClient,
    destination: SessionsClient,
    object_key: str,
    *,
    destination_name: str = "",
    lease_seconds: int = MOVE_LEASE_SECONDS,
    replace: bool = False,
) -> MoveReport:
    """Moves one object: locked snapshot from `source`, verified import into `destination`
    (digest, integrity, and the same sessions and row counts), then deletion at `source`.
    Writes to the object during the move get UNAVAILABLE (OBJECT_MOVING) and should be retried
    against the object's new owner. The destination holds its copy (reads only) until the
    source is deleted, then releases it: no write lands on the copy while the source may still
    take one. When a step before the deletion fails, or the source refuses it, it raises
    SessionsError, drops the destination's copy and leaves the source in place, its lock
    released (AbortMove) so it takes writes again at once: one writable copy either way.

    An object `destination` already holds is not overwritten (FAILED_PRECONDITION, before
    anything is sent) unless `replace`: it may be a copy an earlier attempt of this move left
    there, or an object of its own whose writes would be lost. One the destination itself moved
    away earlier is replaced either way. With tokens, both clients' must grant every key (prefix
    ""): a move's steps are an operator's (PERMISSION_DENIED otherwise; the source's lock, if it
    was taken, is released as for any step that fails)."""
    metadata_source = routing_metadata(object_key, source._token)
    metadata_destination = routing_metadata(object_key, destination._token)
    _check_reachable(destination, object_key, metadata_destination)  # before the source is locked
    export = source._stub.ExportObject(
        pb.ExportObjectRequest(object_key=object_key, lock_for_move=True, lease_seconds=lease_seconds),
        metadata=metadata_source,
    )
    try:
        head = next(iter(export))  # the source's own refusal (not found, not owned) surfaces as itself
    except grpc.RpcError as error:
        raise SessionsError.from_rpc_error(error) from None

    export_failure: list[grpc.RpcError] = []
    move_ids: list[str] = []  # the lock's, from the export's last frame

    def frames() -> Iterator[pb.ImportObjectRequest]:
        first = True
        try:
            for frame in itertools.chain([head], export):
                if frame.move_id:
                    move_ids.append(frame.move_id)
                request = pb.ImportObjectRequest(data=frame.data, sha256=frame.sha256)
                if first:
                    request.object_key = object_key
                    request.replace = replace
                    request.hold_for_move = True
                    first = False
                yield request
        except grpc.RpcError as error:  # gRPC reports it as "Exception iterating requests!"
            export_failure.append(error)
            raise

    hold = ""  # the destination's hold on its copy (none from a server that predates holds)
    try:
        try:
            imported = destination._stub.ImportObject(frames(), metadata=metadata_destination)
        except grpc.RpcError as error:
            # The source's failure mid-snapshot is the cause; the import only saw its requests end.
            if export_failure:
                raise SessionsError.from_rpc_error(export_failure[0]) from None
            refused = SessionsError.from_rpc_error(error)
            # A failure after the copy was installed names its hold, for the undo to drop it.
            hold = refused.metadata.get("move_id", "")
            raise _unanswered_import(refused) from None
        hold = imported.move_id
        # The source refuses writes since the snapshot, so its state now is what was copied.
        before = source.object(object_key).list_sessions()
        after = destination.object(object_key).list_sessions()
        if imported.message_rows != sum(count for _, count in after):
            raise SessionsError(
                grpc.StatusCode.DATA_LOSS,
                f"verification failed: the destination installed {imported.message_rows} message rows and reads "
                f"back {after}; the source was kept",
                "FAILED_PRECONDITION",
                {},
            )
        if after != before:
            # The copy arrived whole (its digest checked) and reads back as installed: the source
            # changed after its snapshot.
            raise SessionsError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the source took writes after its locked snapshot (its lock was released by AbortMove, or its "
                f"lease of {lease_seconds} s ran out: give objects whose copy takes longer a longer lease): the "
                f"copy holds sessions {after}, the source {before}; the source was kept",
                "FAILED_PRECONDITION",
                {},
            )
    except BaseException as failure:  # a refusal, or the mover interrupted: the source takes writes again
        typing.cast(typing.Any, export).cancel()  # a snapshot still being sent is dropped
        left = _undo_move(source, destination, object_key, hold, metadata_source, metadata_destination)
        if left and isinstance(failure, SessionsError):
            raise SessionsError(failure.code, f"{failure.message}; {left}", failure.reason, failure.metadata) from None
        if hold and isinstance(failure, SessionsError) and failure.metadata.get("move_id") == hold:
            # The destination's advice (drop the copy it holds) was taken.
            done = f"{failure.message}; move-object dropped that copy, and the source takes writes again"
            raise SessionsError(failure.code, done, failure.reason, failure.metadata) from None
        raise
    # Naming the lock: if the source lost it meanwhile (an AbortMove, its lease run out), it may
    # have taken writes the copy lacks, and it refuses the delete.
    move_id = move_ids[-1] if move_ids else ""
    try:
        _delete_moved(source, object_key, destination_name, move_id, metadata_source)
    except MoveOutcomeUnknown:
        raise  # the destination keeps holding its copy: it may be the only one now
    except SessionsError as refused:  # refused: the source is the object still, the copy may lack writes
        left = _undo_move(source, destination, object_key, hold, metadata_source, metadata_destination)
        if left:
            raise SessionsError(refused.code, f"{refused.message}; {left}", refused.reason, refused.metadata) from None
        raise
    if hold:
        _release_arrival(destination, object_key, destination_name, metadata_destination)
    return MoveReport(object_key, int(imported.size_bytes), int(imported.message_rows), after)


def _check_reachable(client: SessionsClient, object_key: str, metadata: typing.Any) -> None:
    """Raises DestinationUnreachable when `client`'s server cannot be connected to within
    REACHABLE_SECONDS: the move then starts nothing (unreachable, the destination's import failed
    after the source was locked, and the error said it might hold a copy to replace). Asked with
    a read that changes nothing; any answer, a refusal included, means the server is there (its
    refusal of the move comes with the move's own calls). A connection that fails is waited for
    (a server restarting), unless its TLS handshake failed, which the next would too: that is
    raised at once, in gRPC's words (it waited the 10 s, then said only that it could not
    connect, whatever the TLS settings' fault)."""
    request = pb.GetObjectStatsRequest(object_key=object_key)
    deadline = time.monotonic() + REACHABLE_SECONDS
    last = ""
    for wait_for_ready in (False, True):
        try:
            client._stub.GetObjectStats(
                request,
                metadata=metadata,
                timeout=max(deadline - time.monotonic(), 0.0),
                wait_for_ready=wait_for_ready,
            )
            return
        except grpc.RpcError as error:
            failure = client._rpc_failure(error)
        if failure.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            break  # connected or not, nothing answered (a server stopped, a host that drops packets)
        if failure.code != grpc.StatusCode.UNAVAILABLE or failure.reason:
            return  # an answer: the server is there
        if tls_failed(failure):
            raise DestinationUnreachable(
                failure.code,
                f"the destination could not be connected to ({failure.message}): nothing was moved or locked",
                "",
                {},
            )
        last = f" ({failure.message})"
    raise DestinationUnreachable(
        grpc.StatusCode.UNAVAILABLE,
        f"the destination could not be connected to within {REACHABLE_SECONDS:g} s{last}: nothing was moved or locked",
        "",
        {},
    )


def _unanswered_import(failure: SessionsError) -> SessionsError:
    """An import that got no answer (the destination gone mid-call) may have installed its copy,
    held read-only for this move, whose hold the mover never learnt: a plain retry of the move is
    refused OBJECT_EXISTS there. Said so, with the way out; another refusal (one the destination
    gave a reason for, a storage failure say) is returned as it is."""
    if failure.code not in _NO_ANSWER or (failure.reason and failure.reason != "DRAINING"):
        return failure
    return SessionsError(
        failure.code,
        f"{failure.message}; the destination did not answer the import: it may hold a read-only copy of the "
        "object for this move (the source was kept and takes writes again); move the object again with "
        "replace (move-object --replace), which replaces that copy",
        failure.reason,
        failure.metadata,
    )


def _undo_move(
    source: SessionsClient,
    destination: SessionsClient,
    object_key: str,
    hold: str,
    metadata_source: typing.Any,
    metadata_destination: typing.Any,
) -> str:
    """A move that will not complete: the destination's held copy is dropped, then the source's
    lock released. What could not be undone, said for the caller's error ("" if nothing): a
    copy the destination still holds stays read-only (the hold has no lease), so the source is
    released either way; a lock that could not be released runs out with its lease."""
    left = ""
    if hold:
        try:
            destination._stub.DeleteObject(
                pb.DeleteObjectRequest(object_key=object_key, erase=True, move_id=hold),
                metadata=metadata_destination,
                timeout=destination.timeout or UNDO_TIMEOUT_SECONDS,
            )
        except grpc.RpcError as error:
            left = (
                f"the destination's copy could not be dropped ({SessionsError.from_rpc_error(error).message}): it "
                f"stays there read-only; drop it with DeleteObject erase and move_id {hold}"
            )
    with contextlib.suppress(grpc.RpcError):  # best effort: else the lock lasts its lease
        # The source's lock only: a mover that stalled while the object was moved away and back
        # would release the hold of the copy that came back, beside another taking writes.
        source._stub.AbortMove(
            pb.AbortMoveRequest(object_key=object_key, source_lock_only=True),
            metadata=metadata_source,
            timeout=source.timeout or UNDO_TIMEOUT_SECONDS,
        )
    return left


def _release_arrival(destination: SessionsClient, object_key: str, destination_name: str, metadata: typing.Any) -> None:
    """The move's end at the destination: its copy takes writes from now on. Asked again while
    no answer comes (a repeat releases nothing more)."""
    try:
        _release(destination, object_key, metadata)
    except SessionsError as failure:
        where = destination_name or "the destination"
        raise SessionsError(
            failure.code,
            f"the object moved, but {where} did not release its hold ({failure.message}): it refuses "
            "writes until released; release it with abort-move --release-hold",
            failure.reason,
            failure.metadata,
        ) from None


def _release(client: SessionsClient, object_key: str, metadata: typing.Any, *, source_lock_only: bool = False) -> bool:
    """AbortMove on `client`'s server, asked until answered (`_until_answered`): a repeat
    releases nothing more. Whether a lock or hold was released: after an attempt whose answer
    was lost, a later one finds nothing to release (False) though that attempt may have."""
    request = pb.AbortMoveRequest(object_key=object_key, source_lock_only=source_lock_only)
    answer = _until_answered(
        client, "AbortMove", lambda timeout: client._stub.AbortMove(request, metadata=metadata, timeout=timeout)
    )
    return bool(answer.was_locked)


def _until_answered(
    client: SessionsClient,
    method: str,
    call: Callable[[float | None], _Answer],
    retryable: Callable[[SessionsError], bool] | None = None,
) -> _Answer:
    """`call(timeout)`, asked again under `client`'s retry policy while no answer comes (a server
    restarting, as after a move cut short), for a call whose repeat does nothing more, or only
    after the failures `retryable` takes; never after a failed TLS handshake, which the next
    attempt would meet alike. Each wait is told to the client's `on_retry`; the client's timeout
    bounds every attempt and wait, as it bounds its own calls'."""
    rule = _no_answer if retryable is None else retryable
    attempts = Attempts(
        method, client.retry, client.on_retry, client.timeout, retryable=lambda e: not tls_failed(e) and rule(e)
    )
    while True:
        attempts.begin()
        try:
            return call(attempts.remaining())
        except grpc.RpcError as error:
            failure = client._rpc_failure(error)
        delay = attempts.wait_after(failure)
        if delay is None:
            raise failure from None
        time.sleep(delay)


class DestinationUnreachable(SessionsError):
    """UNAVAILABLE: the move's destination could not be connected to (for REACHABLE_SECONDS,
    or its TLS handshake failed) before anything was locked or sent: nothing changed. The next
    move to it would wait as long for the same answer."""


class MoveOutcomeUnknown(SessionsError):
    """The source never answered the move's last step (its delete): the object may have moved
    (the source then refuses it, OBJECT_NOT_OWNED) or not. The destination keeps its copy, held
    (read-only, restarts included) until it is released or dropped: release it (`release_hold`,
    abort-move --release-hold on the destination) once the source refuses the key; else drop it
    (DeleteObject with erase and the hold's move_id, or move the object again with replace,
    which replaces the held copy)."""


REACHABLE_SECONDS = 10.0
UNDO_TIMEOUT_SECONDS = 30.0
"""A failed move's undo calls, for clients without a timeout of their own: a server that
answers nothing must not hold the mover (which ignores a second SIGTERM while it undoes)."""

# The delete went out and no answer came back: the connection, a proxy or a deadline, not the
# source's own refusal (which has a reason).
_NO_ANSWER: typing.Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def _delete_moved(
    source: SessionsClient, object_key: str, destination_name: str, move_id: str, metadata: typing.Any
) -> None:
    """The move's delete, asked again while no answer comes: a repeat is safe (the source takes a
    repeat of the delete it carried out, and refuses one once the lock is gone). Before, a source
    that crashed during its delete was reported "not moved" although the move had taken effect,
    and the destination's copy, by then the only one, looked like a leftover to remove."""
    request = pb.DeleteObjectRequest(object_key=object_key, moved_to=destination_name, move_id=move_id)
    policy = source.retry  # None: asked once
    for attempt in itertools.count(1):
        try:
            source._stub.DeleteObject(request, metadata=metadata, timeout=source.timeout)
            return
        except grpc.RpcError as error:
            refused = SessionsError.from_rpc_error(error)
        unanswered = refused.code in _NO_ANSWER and (not refused.reason or refused.reason == "DRAINING")
        if not unanswered:
            break
        if policy is None or attempt >= policy.max_attempts:
            raise MoveOutcomeUnknown(
                refused.code,
                f"the source did not answer the delete that ends the move ({refused.message}): the object may "
                f"have moved; {destination_name or 'the destination'} keeps its copy. Ask the source: a read of "
                "the key refused OBJECT_NOT_OWNED means it moved",
                refused.reason,
                refused.metadata,
            ) from None
        time.sleep(policy.backoff(attempt))
    if refused.code != grpc.StatusCode.FAILED_PRECONDITION:
        raise refused from None
    where = destination_name or "the destination"
    raise SessionsError(
        refused.code,
        f"{refused.message}; the copy {where} installed is dropped (a destination that does not hold "
        "arrivals keeps it: move the object again with replace to overwrite it)",
        refused.reason,
        refused.metadata,
    ) from None


def abort_move(source: SessionsClient, object_key: str) -> bool:
    """Releases the move lock `object_key` holds on `source` (AbortMove), so it takes writes
    again: for a move cut short (a mover killed after a locked export) whose lock would otherwise
    last its lease. True when a lock was held; False when there was nothing to release. Only for
    a move that is not running: a mover still at work would go on to delete the source. A
    server holding the copy a move brought to it instead (the move's destination) releases
    nothing and refuses (FAILED_PRECONDITION): see `release_hold`. With tokens, `source`'s must
    grant every key. Asked again, as `source`'s retry policy allows, while no answer comes (the
    source restarting); False after such a retry may mean that an earlier attempt, whose answer
    was lost, released it."""
    return _release(source, object_key, routing_metadata(object_key, source._token), source_lock_only=True)


def release_hold(destination: SessionsClient, object_key: str) -> bool:
    """Releases the hold a move's destination keeps on the copy it received (AbortMove), so the
    copy takes writes: for a move whose mover stopped after deleting its source. Only once the
    move's source refuses the key (OBJECT_NOT_OWNED, naming where it went): while the source
    still holds the object it may take writes, and both copies would then; move the object
    again with `replace` instead, or drop the copy. True when something was released (a source's
    lock too, on a server holding one). Asked again as `abort_move` is."""
    return _release(destination, object_key, routing_metadata(object_key, destination._token))


def erase_object(client: SessionsClient, object_key: str) -> bool:
    """Removes `object_key` from the server for good (DeleteObject with `erase`): its sessions,
    messages, compactions and search index go, nothing is recorded, and its next write starts
    a new, empty object. True when there was an object to remove. Not for moves: `move_object`
    leaves the source refusing the key instead, naming where it went. Asked again, as `client`'s
    retry policy allows, while the server cannot be reached or refuses before acting (draining,
    restarting), but not after an attempt that may have reached it: a repeat would also erase
    what was written since, so that failure is raised and erasing again is the caller's choice."""
    request = pb.DeleteObjectRequest(object_key=object_key, erase=True)
    metadata = routing_metadata(object_key, client._token)
    answer = _until_answered(
        client,
        "DeleteObject",
        lambda timeout: client._stub.DeleteObject(request, metadata=metadata, timeout=timeout),
        retryable=_never_reached,
    )
    return bool(answer.deleted)


def _no_answer(error: SessionsError) -> bool:
    return error.code in _NO_ANSWER


def _never_reached(error: SessionsError) -> bool:
    """Whether the call failed before the server acted on it: refused before acting, or never
    sent (gRPC found no connection to send it on)."""
    if (error.code, error.reason) in REFUSED_BEFORE_ACTING:
        return True
    return (
        error.code == grpc.StatusCode.UNAVAILABLE
        and not error.reason
        and error.message.startswith("failed to connect to all addresses")
    )
