"""`sessions-server move-object` and `abort-move` as an operator runs them: a key that cannot move
(locked by a move cut short) is named and the others still move; `abort-move` releases the lock a
cut-short move left, after which the object moves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.storage.paths import object_path
from sessions_server.transport.auth import hash_token
from tests.deploy.support import free_port
from tests.e2e.conftest import ServerProcess


def _text(message_id: str, text: str) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessions_server.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
    )


def _move(source: str, destination: str, *keys: str) -> subprocess.CompletedProcess[str]:
    options = [item for key in keys for item in ("--object-key", key)]
    return _cli("move-object", "--from", source, "--to", destination, *options)


def _cut_short_export(client: SessionsClient, key: str) -> list[pb.ExportObjectResponse]:
    """What a mover killed after the locked export's last frame leaves: the whole snapshot read,
    the stream ended, and no AbortMove or DeleteObject; the lock stays for its lease (an hour)."""
    request = pb.ExportObjectRequest(object_key=key, lock_for_move=True, lease_seconds=3600)
    frames = list(client._stub.ExportObject(request, metadata=routing_metadata(key)))
    assert frames and frames[-1].sha256
    return frames


def _writes_refused_as_moving(client: SessionsClient, key: str) -> bool:
    try:
        client.object(key).session().append_message(_text("probe", "is it locked?"))
    except SessionsError as error:
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING"), error
        return True
    return False


def _keys(client: SessionsClient) -> set[str]:
    return set(client._stub.ListObjects(pb.ListObjectsRequest()).object_keys)


def _run_that_stops(a: SessionsClient, source: str, destination: str, keys: list[str]) -> list[str]:
    """A run of `keys` (each stored first) that fails at its first object and moves none: its
    error lines, the summary's count checked."""
    for key in keys:
        a.object(key).session().append_message(_text("m1", key))
    result = _move(source, destination, *keys)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and result.stdout == ""
    summary = result.stderr.splitlines()
    count = f"{len(keys)} of {len(keys)} objects not moved (0 moved)"
    assert summary[-len(keys) - 1] == f"sessions-server move-object: {count} from {source} to {destination}:"
    return summary


def _all_take_writes(a: SessionsClient, keys: list[str]) -> None:
    assert _keys(a) == set(keys)
    for key in keys:  # none left locked
        assert a.object(key).session().append_message(_text("m2", "after")).inserted


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    first = ServerProcess(tmp_path / "a").start()
    second = ServerProcess(tmp_path / "b").start()
    yield first, second
    first.stop()
    second.stop()


def test_a_locked_object_is_named_and_the_others_still_move(two_servers: tuple[ServerProcess, ServerProcess]) -> None:
    source, destination = two_servers
    keys = ["batch/1", "batch/2", "batch/3", "batch/4"]
    with SessionsClient(source.address, retry=None) as a:
        for key in keys:
            a.object(key).session().append_message(_text("m1", key))
        _cut_short_export(a, "batch/2")

        result = _move(source.address, destination.address, *keys)

        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr
        for key in ("batch/1", "batch/3", "batch/4"):  # those after the locked key too
            assert f"moved {key!r}" in result.stdout
        assert "batch/2" not in result.stdout
        summary = result.stderr.splitlines()
        assert f"1 of 4 objects not moved (3 moved) from {source.address} to {destination.address}:" in summary[-2]
        hint = f"`sessions-server abort-move --from {source.address} --object-key=batch/2`"
        assert summary[-1].startswith("  'batch/2': UNAVAILABLE [OBJECT_MOVING]: a move of this object is under way")
        assert hint in summary[-1]
        with SessionsClient(destination.address) as b:
            assert _keys(b) == {"batch/1", "batch/3", "batch/4"}
            assert b.object("batch/3").session().get_message("m1") == _text("m1", "batch/3")
        assert _keys(a) == {"batch/2"}
        assert object_path(source.data_dir, "batch/2").exists()
        # The refused move left the other mover's lock alone: it is not this command's to release.
        assert _writes_refused_as_moving(a, "batch/2")


def test_a_run_to_a_destination_that_cannot_be_connected_to_stops_at_its_first_object(tmp_path: Path) -> None:
    """Each key waited the 10 s for the destination again: a re-shard's run to a shard that was
    down took hours. The rest of the run is reported not attempted; nothing is locked or moved."""
    source = ServerProcess(tmp_path / "a").start()
    try:
        keys = ["down/1", "down/2", "down/3"]
        with SessionsClient(source.address, retry=None) as a:
            dead = f"127.0.0.1:{free_port()}"  # nothing listens there

            summary = _run_that_stops(a, source.address, dead, keys)

            assert (
                f"sessions-server move-object: {dead} could not be connected to: the other 2 object(s) are not "
                "attempted; run this again once it answers"
            ) in summary
            assert summary[-3].startswith(
                "  'down/1': UNAVAILABLE: the destination could not be connected to within 10 s"
            )
            assert summary[-2:] == [
                f"  'down/2': UNAVAILABLE: not attempted: {dead} could not be connected to for 'down/1'",
                f"  'down/3': UNAVAILABLE: not attempted: {dead} could not be connected to for 'down/1'",
            ]
            _all_take_writes(a, keys)
    finally:
        source.stop()


def test_a_run_to_the_source_by_another_address_stops_at_its_first_object(tmp_path: Path) -> None:
    """`--from 127.0.0.1:P --to localhost:P`: the source's import of its own locked snapshot was
    refused as "being moved; retry shortly", and the advice (release the lock with abort-move,
    move again) met the same refusal. Now it is named for what it is, the run stops there, and
    every object takes writes again."""
    source = ServerProcess(tmp_path / "a").start()
    try:
        keys = ["self/1", "self/2", "self/3"]
        with SessionsClient(source.address, retry=None) as a:
            alias = source.address.replace("127.0.0.1", "localhost")

            summary = _run_that_stops(a, source.address, alias, keys)

            assert (
                f"sessions-server move-object: {alias} is moving the object away itself: the other 2 object(s) are "
                f"not attempted; check that --to names another server than --from ({source.address}), not the same "
                "one by another address"
            ) in summary
            assert summary[-3].startswith("  'self/1': FAILED_PRECONDITION: this server is moving the object away")
            assert summary[-3].endswith("[OBJECT_DEPARTING]")
            assert not any("abort-move" in line for line in summary)
            assert summary[-2:] == [
                f"  '{key}': FAILED_PRECONDITION: not attempted: {alias} is moving the object away itself for 'self/1'"
                for key in ("self/2", "self/3")
            ]
            _all_take_writes(a, keys)  # the first one's lock released
            for key in keys:
                assert [m["id"] for m in a.object(key).session().get_history()] == ["m1", "m2"]
    finally:
        source.stop()


def test_abort_move_releases_the_lock_of_a_move_cut_short_and_the_object_then_moves(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    source, destination = two_servers
    with SessionsClient(source.address, retry=None) as a, SessionsClient(destination.address) as b:
        session = a.object("cut/1").session()
        for index in range(5):
            session.append_message(_text(f"m{index}", "before"))
        # The mover got as far as the import, then was killed before DeleteObject: the object is
        # on both servers, and locked on its source.
        frames = _cut_short_export(a, "cut/1")
        requests = [pb.ImportObjectRequest(data=frame.data, sha256=frame.sha256) for frame in frames]
        requests[0].object_key, requests[0].replace = "cut/1", True
        b._stub.ImportObject(iter(requests), metadata=routing_metadata("cut/1"))
        refused = _move(source.address, destination.address, "cut/1")
        assert refused.returncode == 1 and "abort-move" in refused.stderr, refused
        assert _writes_refused_as_moving(a, "cut/1")

        released = _cli("abort-move", "--from", source.address, "--object-key", "cut/1")

        assert released.returncode == 0, released
        assert released.stdout == f"released the move lock of 'cut/1' on {source.address}: it takes writes again\n"
        assert session.append_message(_text("m5", "after the release")).inserted
        again = _cli("abort-move", "--from", source.address, "--object-key", "cut/1")
        assert (again.returncode, again.stdout) == (
            0,
            f"'cut/1' on {source.address} held no move lock: nothing to release\n",
        )

        held = _move(source.address, destination.address, "cut/1")  # the cut-short copy is there
        assert held.returncode == 1 and "--replace" in held.stderr, held
        moved = _cli(
            "move-object", "--from", source.address, "--to", destination.address, "--object-key", "cut/1", "--replace"
        )

        assert moved.returncode == 0, moved
        assert "moved 'cut/1'" in moved.stdout and "6 messages" in moved.stdout
        assert [m["id"] for m in b.object("cut/1").session().get_history()] == [f"m{i}" for i in range(6)]
        assert not object_path(source.data_dir, "cut/1").exists()
        assert _keys(a) == set()


def test_abort_move_leaves_a_destinations_hold_unless_asked_to_release_it(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """A mover killed after its import and before its delete leaves the source locked and the
    destination holding its copy. `abort-move` run on both (its help said `--from` was "the
    server holding the lock") released both, each saying "it takes writes again", and the two
    copies then took writes side by side. The destination's hold is now released only with
    `--release-hold`, which its refusal names."""
    source, destination = two_servers
    with SessionsClient(source.address, retry=None) as a, SessionsClient(destination.address, retry=None) as b:
        a.object("cut/2").session().append_message(_text("m1", "before"))
        frames = _cut_short_export(a, "cut/2")
        requests = [pb.ImportObjectRequest(data=frame.data, sha256=frame.sha256) for frame in frames]
        requests[0].object_key, requests[0].hold_for_move = "cut/2", True
        assert b._stub.ImportObject(iter(requests), metadata=routing_metadata("cut/2")).move_id

        kept = _cli("abort-move", "--from", destination.address, "--object-key", "cut/2")

        assert (kept.returncode, kept.stdout) == (1, ""), kept
        [line] = kept.stderr.splitlines()
        assert line.startswith(f"sessions-server abort-move: 'cut/2' on {destination.address}: FAILED_PRECONDITION")
        assert "holds the copy a move brought here" in line and "--release-hold" in line
        assert _writes_refused_as_moving(b, "cut/2")

        # The move's delete, then the source refuses the key: the hold is released by name.
        delete = pb.DeleteObjectRequest(object_key="cut/2", moved_to=destination.address, move_id=frames[-1].move_id)
        assert a._stub.DeleteObject(delete, metadata=routing_metadata("cut/2")).deleted
        asked = _cli("abort-move", "--from", destination.address, "--object-key", "cut/2", "--release-hold")
        assert (asked.returncode, asked.stdout) == (
            0,
            f"released the move lock or hold of 'cut/2' on {destination.address}: it takes writes again\n",
        ), asked
        assert not _writes_refused_as_moving(b, "cut/2")


def test_abort_move_uses_the_token_and_reports_a_refusal_on_one_line(tmp_path: Path) -> None:
    """A move's steps are an operator's: a tenant's write grant may write its keys but neither
    lock one for a move nor release a lock (a second security audit: a tenant held its keys
    against a re-shard, and could have readers told a key moved anywhere it liked)."""
    tokens = tmp_path / "tokens.json"
    grants = [
        {"name": "operator", "sha256": hash_token("o-secret"), "prefixes": [""], "access": "write"},
        {"name": "writer", "sha256": hash_token("w-secret"), "prefixes": ["tenant-a/"], "access": "write"},
        {"name": "reader", "sha256": hash_token("r-secret"), "prefixes": ["tenant-a/"], "access": "read"},
    ]
    tokens.write_text(json.dumps({"tokens": grants}), encoding="utf-8")
    server = ServerProcess(tmp_path / "data", "--tokens-file", str(tokens)).start()
    try:
        with SessionsClient(server.address, token="w-secret", retry=None) as client:
            client.object("tenant-a/x").session().append_message(_text("m1", "one"))
            request = pb.ExportObjectRequest(object_key="tenant-a/x", lock_for_move=True, lease_seconds=3600)
            with pytest.raises(grpc.RpcError) as refused:
                list(client._stub.ExportObject(request, metadata=routing_metadata("tenant-a/x", "w-secret")))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "needs a token granting every object key" in (refused.value.details() or "")
            assert not _writes_refused_as_moving(client, "tenant-a/x")
            assert list(client._stub.ExportObject(request, metadata=routing_metadata("tenant-a/x", "o-secret")))
            assert _writes_refused_as_moving(client, "tenant-a/x")

            for token in ("r-secret", "w-secret"):
                refusal = _cli("abort-move", "--from", server.address, "--object-key", "tenant-a/x", "--token", token)
                assert refusal.returncode == 1
                assert refusal.stdout == ""
                [line] = refusal.stderr.splitlines()
                assert line.startswith(
                    f"sessions-server abort-move: 'tenant-a/x' on {server.address}: PERMISSION_DENIED"
                ), line
                assert _writes_refused_as_moving(client, "tenant-a/x")

            operator = _cli(
                "abort-move",
                "--from",
                server.address,
                "--object-key",
                "tenant-a/x",
                env={**os.environ, "SESSIONS_TOKEN": "o-secret"},
            )
            assert operator.returncode == 0, operator
            assert operator.stdout.startswith("released the move lock of 'tenant-a/x'")
            assert not _writes_refused_as_moving(client, "tenant-a/x")
    finally:
        server.stop()


def test_an_object_the_destination_holds_is_not_overwritten_without_replace(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """move-object replaced the destination's own copy of a key without a word: its messages
    were gone. It now leaves both alone and says so; `--replace` overwrites."""
    source, destination = two_servers
    with SessionsClient(source.address, retry=None) as a, SessionsClient(destination.address, retry=None) as b:
        a.object("both").session().append_message(_text("m1", "from the source"))
        b.object("both").session().append_message(_text("m1", "only on the destination"))

        refused = _move(source.address, destination.address, "both")

        assert refused.returncode == 1, refused
        assert "Traceback" not in refused.stderr
        assert "the destination already holds this object" in refused.stderr and "--replace" in refused.stderr
        assert b.object("both").session().get_message("m1") == _text("m1", "only on the destination")
        assert a.object("both").session().append_message(_text("m2", "the source still takes writes")).inserted

        replaced = _cli(
            "move-object", "--from", source.address, "--to", destination.address, "--object-key", "both", "--replace"
        )

        assert replaced.returncode == 0, replaced
        assert [m["id"] for m in b.object("both").session().get_history()] == ["m1", "m2"]
        assert b.object("both").session().get_message("m1") == _text("m1", "from the source")


class LosingRelay(grpc.GenericRpcHandler):
    """Relays every call to `target` as bytes, except that the answers of the first `lose`
    calls of `method` are lost after the server carried them out (a server that crashed, or a
    connection cut, right after a move's delete or import): the caller gets UNAVAILABLE."""

    def __init__(self, target: str, lose: int, method: str = "DeleteObject") -> None:
        self._channel = grpc.insecure_channel(target)
        self._lose = lose
        self._method = "/" + method
        self.deletes = 0
        methods = pb.DESCRIPTOR.services_by_name["SessionService"].methods_by_name
        self._streaming = {name: (m.client_streaming, m.server_streaming) for name, m in methods.items()}
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers((self,))
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(None).wait(30)
        self._channel.close()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes] | None:
        method = details.method or ""
        client_streaming, server_streaming = self._streaming[method.rsplit("/", 1)[1]]
        kind = ("stream" if client_streaming else "unary") + "_" + ("stream" if server_streaming else "unary")
        upstream = getattr(self._channel, kind)(method)

        def forward(request: Any, context: grpc.ServicerContext) -> Any:
            metadata = [(k, v) for k, v in context.invocation_metadata() if k == "x-object-key"]
            if method.endswith(self._method):
                answer = upstream(request, metadata=metadata)
                self.deletes += 1
                if self.deletes <= self._lose:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "relay: the answer was lost")
                return answer
            return upstream(request, metadata=metadata)

        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(forward)  # type: ignore[no-any-return]


def _move_through_losing_relay(
    servers: tuple[ServerProcess, ServerProcess], key: str, lose: int
) -> tuple[subprocess.CompletedProcess[str], int]:
    """Writes one message to `key` on the source, then moves it through a relay that loses the
    answers of the first `lose` deletes; returns the CLI's outcome and the deletes relayed."""
    source, destination = servers
    with SessionsClient(source.address) as client:
        client.object(key).session().append_message(_text("m1", "hello"))
    relay = LosingRelay(source.address, lose=lose)
    try:
        return _move(relay.address, destination.address, key), relay.deletes
    finally:
        relay.close()


def test_a_move_whose_delete_went_unanswered_asks_again_and_is_reported_moved(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """The source carried out the move's delete, but its answer was lost: the mover reported
    "not moved", though the destination's copy was by then the only one. The delete is asked
    again with the same lock; the source takes the repeat, and the move is reported done."""
    source, destination = two_servers
    done, deletes = _move_through_losing_relay(two_servers, "lost", lose=1)
    assert done.returncode == 0, done.stderr
    assert "moved 'lost'" in done.stdout
    assert deletes == 2
    with SessionsClient(destination.address) as client:
        assert [m["id"] for m in client.object("lost").session().get_history()] == ["m1"]
    with SessionsClient(source.address, retry=None) as client, pytest.raises(SessionsError) as refused:
        client.object("lost").session().get_history()
    assert refused.value.reason == "OBJECT_NOT_OWNED"


def test_a_move_whose_delete_is_never_answered_is_reported_of_unknown_outcome(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """No answer to any of the repeats (the client's retries, about 9 s): not "not moved", which
    invited removing the destination's copy, but an outcome unknown, and how to find it out."""
    _, destination = two_servers
    done, _ = _move_through_losing_relay(two_servers, "unsure", lose=1_000)
    assert done.returncode == 1
    assert "'unsure': outcome unknown: the source did not answer the delete" in done.stderr
    assert "not moved (0 moved; 1 of the others may have: outcome unknown)" in done.stderr
    assert "OBJECT_NOT_OWNED means it moved" in done.stderr
    with SessionsClient(destination.address) as client:  # the copy stays
        assert [m["id"] for m in client.object("unsure").session().get_history()] == ["m1"]
