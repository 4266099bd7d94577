"""Moving objects between servers: complete, verified, and no acknowledged write left behind."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError, admin
from sessions_client.admin import move_object
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.storage.paths import object_path
from tests.deploy.support import free_port
from tests.e2e.conftest import ServerProcess
from tests.e2e.test_move_cli import LosingRelay
from tests.reliability.support import wait_until


def _stable(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    """Overlay messages carry the time of the read; everything else must match exactly."""
    return [
        {k: v for k, v in m.items() if k != "createdAt"} if str(m["id"]).startswith("compaction_") else m
        for m in messages
    ]


def _text(message_id: str, text: str) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


@pytest.fixture
def two_servers(tmp_path: Path):  # type: ignore[no-untyped-def]
    first = ServerProcess(tmp_path / "a").start()
    second = ServerProcess(tmp_path / "b").start()
    yield first, second
    first.stop()
    second.stop()


def test_move_carries_sessions_compactions_and_attachments(two_servers) -> None:  # type: ignore[no-untyped-def]
    source, destination = two_servers
    image = "data:image/png;base64," + "iVBORw0KGgo" * 30_000 + "A="
    with SessionsClient(source.address, retry=None) as a, SessionsClient(destination.address) as b:
        obj = a.object("moving/1")
        main, side = obj.session(), obj.session("side")
        for index in range(30):
            main.append_message(_text(f"m{index}", f"hello {index}"))
        main.append_message(
            {"id": "img", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": image}]}
        )
        side.append_message(_text("s1", "x" * 3_000_000))  # continuation rows
        record = main.add_compaction("summary", "m3", "m9")
        expected = main.get_history()
        expected_side = side.get_history()

        report = move_object(a, b, "moving/1", destination_name=destination.address)

        assert report.message_rows == 32
        moved = b.object("moving/1")
        assert _stable(moved.session().get_history()) == _stable(expected)
        assert moved.session("side").get_history() == expected_side
        assert [c.id for c in moved.session().list_compactions()] == [record.id]
        assert not object_path(source.data_dir, "moving/1").exists()
        with pytest.raises(SessionsError) as refused:
            main.append_message(_text("late", "after the move"))
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.reason == "OBJECT_NOT_OWNED"
        assert destination.address in refused.value.message


def test_writes_during_a_move_are_refused_retryably_and_none_is_lost(two_servers) -> None:  # type: ignore[no-untyped-def]
    source, destination = two_servers
    acknowledged: list[str] = []
    refused: list[str] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    with SessionsClient(source.address) as a, SessionsClient(destination.address) as b:
        session = a.object("busy").session()
        session.append_message(_text("m0", "start"))
        acknowledged.append("m0")

        def writer() -> None:
            try:
                with SessionsClient(source.address, retry=None) as own:  # the refusals are what is tested
                    own_session = own.object("busy").session()
                    index = 1
                    while not stop.is_set():
                        try:
                            own_session.append_message(_text(f"m{index}", "during"))
                            acknowledged.append(f"m{index}")
                        except SessionsError as error:
                            refused.append(f"{error.code.name}:{error.reason}")
                            if error.reason == "OBJECT_NOT_OWNED":
                                return
                        index += 1
            except BaseException as error:  # reported by the test thread
                failures.append(error)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            # Some writes land before the move starts.
            assert wait_until(lambda: len(acknowledged) >= 20 or not thread.is_alive(), timeout=60)
            assert not failures, failures
            assert len(acknowledged) >= 20, f"the writer stopped after {acknowledged}: {refused}"
            move_object(a, b, "busy", destination_name=destination.address)
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not thread.is_alive()
        assert not failures, failures
        stored = [m["id"] for m in b.object("busy").session().history()]
    assert set(acknowledged) <= set(stored)
    assert all(reason in ("UNAVAILABLE:OBJECT_MOVING", "FAILED_PRECONDITION:OBJECT_NOT_OWNED") for reason in refused)


def test_move_object_command(two_servers) -> None:  # type: ignore[no-untyped-def]
    source, destination = two_servers
    with SessionsClient(source.address) as a:
        a.object("cli/1").session().append_message(_text("m1", "one"))
        a.object("cli/2").session().append_message(_text("m1", "two"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessions_server.cli",
            "move-object",
            "--from",
            source.address,
            "--to",
            destination.address,
            "--object-key",
            "cli/1",
            "--object-key",
            "cli/2",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "moved 'cli/1'" in result.stdout
    with SessionsClient(destination.address) as b:
        assert b.object("cli/2").session().get_message("m1") == _text("m1", "two")
        keys = set(b._stub.ListObjects(pb.ListObjectsRequest()).object_keys)
    assert keys == {"cli/1", "cli/2"}


def test_a_move_into_a_server_with_smaller_limits_is_refused_and_the_source_kept(tmp_path: Path) -> None:
    source = ServerProcess(tmp_path / "a").start()
    destination = ServerProcess(tmp_path / "b", "--max-role-bytes", "16").start()
    try:
        with SessionsClient(source.address) as a, SessionsClient(destination.address) as b:
            session = a.object("roles").session()
            session.append_message(_text("m1", "hello"))
            session.append_message({"id": "m2", "role": "a-role-of-23-characters", "parts": []})
            expected = session.get_history()
            with pytest.raises(SessionsError) as refused:
                move_object(a, b, "roles", destination_name=destination.address)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.reason == "LIMIT_EXCEEDED"
            assert refused.value.metadata["limit"] == "max_role_bytes"
            assert "id 'm2': its role is 23 bytes; the limit is 16 bytes" in refused.value.message
            assert list(b._stub.ListObjects(pb.ListObjectsRequest()).object_keys) == []
            assert session.get_history() == expected  # the source still serves the object
            # and takes writes at once: the failed move released its lock (AbortMove)
            assert session.append_message(_text("m3", "after the failed move")).inserted
    finally:
        source.stop()
        destination.stop()


def test_objects_with_keys_past_the_default_limit_move_where_the_limit_is_raised(tmp_path: Path) -> None:
    key = "k" * 2_000
    source = ServerProcess(tmp_path / "a", "--max-object-key-bytes", "4096").start()
    destination = ServerProcess(tmp_path / "b", "--max-object-key-bytes", "4096").start()
    try:
        with SessionsClient(source.address) as a, SessionsClient(destination.address) as b:
            a.object(key).session().append_message(_text("m1", "long key"))
            report = move_object(a, b, key, destination_name=destination.address)
            assert report.message_rows == 1
            assert b.object(key).session().get_message("m1") == _text("m1", "long key")
    finally:
        source.stop()
        destination.stop()


def test_a_file_larger_than_an_object_may_be_is_refused_as_it_arrives(tmp_path: Path) -> None:
    source = ServerProcess(tmp_path / "a").start()
    destination = ServerProcess(tmp_path / "b", "--max-object-bytes", str(1024 * 1024)).start()
    try:
        with SessionsClient(source.address) as a, SessionsClient(destination.address) as b:
            session = a.object("large").session()
            session.append_message(_text("m1", "x" * 3_000_000))  # a file of about 3 MB
            with pytest.raises(SessionsError) as refused:
                move_object(a, b, "large", destination_name=destination.address)
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.value.metadata["limit"] == "max_object_bytes"
            assert list(b._stub.ListObjects(pb.ListObjectsRequest()).object_keys) == []
            assert [p for p in (tmp_path / "b").rglob("*") if p.is_file() and "import" in p.name] == []
            assert session.get_message("m1") == _text("m1", "x" * 3_000_000)
            assert session.append_message(_text("m2", "after the failed move")).inserted
    finally:
        source.stop()
        destination.stop()


def test_abort_move_releases_the_lock_of_a_move_that_will_not_complete(two_servers) -> None:  # type: ignore[no-untyped-def]
    source, _ = two_servers
    with SessionsClient(source.address, retry=None) as a:
        session = a.object("stuck").session()
        session.append_message(_text("m1", "before"))
        metadata = (("x-object-key", "stuck"),)
        export = pb.ExportObjectRequest(object_key="stuck", lock_for_move=True, lease_seconds=3600)
        assert b"".join(frame.data for frame in a._stub.ExportObject(export, metadata=metadata))
        with pytest.raises(SessionsError) as locked:
            session.append_message(_text("m2", "during"))
        assert (locked.value.code, locked.value.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")

        abort = pb.AbortMoveRequest(object_key="stuck")
        assert a._stub.AbortMove(abort, metadata=metadata).was_locked
        assert session.append_message(_text("m2", "after")).inserted
        assert not a._stub.AbortMove(abort, metadata=metadata).was_locked  # nothing left to release


def test_a_move_whose_import_got_no_answer_says_how_to_finish_it(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """A client audit: a destination that died after installing its held copy, before answering,
    left the mover with a bare UNAVAILABLE; a plain retry of the move was then refused
    OBJECT_EXISTS there. The error says the destination may hold a copy and how to replace it;
    the source takes writes again."""
    source, destination = two_servers
    relay = LosingRelay(destination.address, lose=1, method="ImportObject")
    try:
        with SessionsClient(source.address, retry=None) as a, SessionsClient(relay.address, retry=None) as b:
            a.object("k").session().append_message(_text("m1", "before"))
            with pytest.raises(SessionsError) as unanswered:
                move_object(a, b, "k")
            assert unanswered.value.code == grpc.StatusCode.UNAVAILABLE
            assert "may hold a read-only copy" in unanswered.value.message
            assert "move-object --replace" in unanswered.value.message
            assert a.object("k").session().append_message(_text("m2", "after")).inserted
            report = move_object(a, b, "k", replace=True)
            assert report.message_rows == 2
    finally:
        relay.close()


@pytest.mark.parametrize("destination", ["nothing listening", "listening, silent"])
def test_a_move_to_a_server_that_cannot_be_reached_locks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, destination: str
) -> None:
    """The source was locked first, then the import failed to connect, and the error said the
    destination might hold a copy to replace (with --replace, which could overwrite an object of
    its own there). A destination that takes connections and says nothing (a stopped process, a
    host that drops packets past the handshake) is no answer either (a review of a change that
    took it for the server being there)."""
    monkeypatch.setattr(admin, "REACHABLE_SECONDS", 0.5)
    source = ServerProcess(tmp_path / "a").start()
    with contextlib.ExitStack() as stack:
        if destination == "nothing listening":
            address = f"127.0.0.1:{free_port()}"
        else:  # the kernel completes connections; nobody reads
            silent = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
            address = f"127.0.0.1:{silent.getsockname()[1]}"
        try:
            with SessionsClient(source.address, retry=None) as a, SessionsClient(address, retry=None) as b:
                a.object("k").session().append_message(_text("m1", "before"))
                with pytest.raises(SessionsError) as unreachable:
                    move_object(a, b, "k")
                assert unreachable.value.code == grpc.StatusCode.UNAVAILABLE
                assert isinstance(unreachable.value, admin.DestinationUnreachable)
                assert "destination could not be connected to within" in unreachable.value.message
                assert "nothing was moved or locked" in unreachable.value.message
                assert "replace" not in unreachable.value.message
                assert a.object("k").session().append_message(_text("m2", "after")).inserted
        finally:
            source.stop()


def test_an_import_the_destination_refused_for_its_storage_is_reported_as_it_is(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """A refusal the destination gave a reason for (its disk failing) was reported as an import
    that got no answer, with advice to move again with --replace."""
    source, destination = two_servers
    (destination.data_dir / "ARRIVING.new").mkdir()  # the import's hold cannot be recorded there
    with SessionsClient(source.address, retry=None) as a, SessionsClient(destination.address, retry=None) as b:
        a.object("k").session().append_message(_text("m1", "before"))
        with pytest.raises(SessionsError) as refused:
            move_object(a, b, "k")
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "STORAGE_FAILURE")
        assert "recording the import's hold failed" in refused.value.message
        assert "may hold a read-only copy" not in refused.value.message
        assert a.object("k").session().append_message(_text("m2", "after")).inserted
