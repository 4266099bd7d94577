"""DeleteMessages and ClearMessages (reference notes §5): splicing to the nearest surviving
ancestor, the active leaf afterwards, continuation rows, seq after delete and clear."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client.admin import export_file
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.domain.limits import Limits
from sessions_server.storage.paths import object_path
from tests.conftest import start_server
from tests.service.support import chunk_rows, ids, message_row, message_rows, text_message


def parents(data_dir: Path, object_key: str, session_id: str = "") -> dict[str, str | None]:
    return {r["id"]: r["parent_id"] for r in message_rows(data_dir, object_key, session_id)}


def test_delete_splices_children_to_nearest_surviving_ancestor(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message(i) for i in "abcd"])

    assert session.delete_messages(["b", "c"]) == 2

    assert parents(data_dir, object_key) == {"a": None, "d": "a"}
    assert ids(session.get_history()) == ["a", "d"]
    assert session.get_latest_leaf()["id"] == "d"


def test_delete_mid_chain(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("s1"), text_message("s2"), text_message("s3")])
    session.delete_messages(["s2"])
    assert ids(session.get_history()) == ["s1", "s3"]
    assert parents(data_dir, object_key) == {"s1": None, "s3": "s1"}


def build_two_branches(session: Any) -> None:
    """root ─ left-1 ─ left-2 ─ left-leaf, and root ─ right."""
    session.append_messages([text_message("root"), text_message("left-1"), text_message("left-2")])
    session.append_message(text_message("left-leaf"))
    session.append_message(text_message("right"), parent_id="root")


def test_delete_of_a_span_rewires_only_the_boundary_child(session: Any, data_dir: Path, object_key: str) -> None:
    build_two_branches(session)
    session.delete_messages(["left-1", "left-2"])
    assert parents(data_dir, object_key) == {"root": None, "left-leaf": "root", "right": "root"}
    assert ids(session.get_history(leaf_id="left-leaf")) == ["root", "left-leaf"]


def test_deleting_root_and_a_leaf_makes_the_sibling_a_root(session: Any, data_dir: Path, object_key: str) -> None:
    build_two_branches(session)
    session.delete_messages(["root", "left-leaf"])
    assert parents(data_dir, object_key) == {"left-1": None, "left-2": "left-1", "right": None}
    assert ids(session.get_history(leaf_id="right")) == ["right"]
    assert ids(session.get_history(leaf_id="left-2")) == ["left-1", "left-2"]


def test_after_deleting_the_leaf_the_max_seq_row_is_the_leaf(session: Any, data_dir: Path, object_key: str) -> None:
    """Upstream [ran]: chain a-b-c-d-e plus c2 under b, appended after d; deleting e makes c2 the
    active leaf, not d."""
    session.append_messages([text_message(i) for i in "abcd"])
    session.append_message(text_message("c2"), parent_id="b")
    session.append_message(text_message("e"), parent_id="d")

    session.delete_messages(["e"])

    assert session.get_latest_leaf()["id"] == "c2"
    assert ids(session.get_history()) == ["a", "b", "c2"]
    # the next auto append attaches to it and takes max(seq)+1, reusing e's seq (observed)
    result = session.append_message(text_message("f"))
    assert result.parent_id == "c2"
    assert message_row(data_dir, object_key, "f")["seq"] == 6  # type: ignore[index]


def test_delete_counts_only_existing_ids(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message(i) for i in "abc"])
    assert session.delete_messages(["b", "nope", "b"]) == 1
    assert ids(message_rows(data_dir, object_key)) == ["a", "c"]
    assert session.delete_messages([]) == 0
    assert session.delete_messages(["zzz"]) == 0
    assert ids(message_rows(data_dir, object_key)) == ["a", "c"]


def test_delete_removes_continuation_rows(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("small"))
    session.append_message(text_message("big", "x" * 2_000_000))
    session.append_message(text_message("big2", "y" * 2_000_000))
    assert {c["id"] for c in chunk_rows(data_dir, object_key)} == {"big", "big2"}

    session.delete_messages(["big"])

    assert [(c["id"], c["idx"]) for c in chunk_rows(data_dir, object_key)] == [("big2", 1)]
    assert ids(session.get_history()) == ["small", "big2"]


def test_delete_and_clear_on_an_empty_session(session: Any, data_dir: Path, object_key: str) -> None:
    assert session.delete_messages(["a"]) == 0
    assert session.clear_messages() == 0
    assert session.get_latest_leaf() is None
    session.append_message(text_message("a"))
    assert message_row(data_dir, object_key, "a")["seq"] == 1  # type: ignore[index]


def test_clear_removes_everything_and_restarts_seq(obj: Any, data_dir: Path, object_key: str) -> None:
    session, other = obj.session(), obj.session("other")
    session.append_messages([text_message("a"), text_message("b", "z" * 2_000_000), text_message("c")])
    other.append_messages([text_message("a"), text_message("big", "q" * 2_000_000)])

    assert session.clear_messages() == 3

    assert message_rows(data_dir, object_key) == []
    assert chunk_rows(data_dir, object_key) == []
    assert session.get_latest_leaf() is None
    assert session.get_history() == []
    assert session.get_history_row_stats() == []
    # the other session is untouched
    assert ids(message_rows(data_dir, object_key, "other")) == ["a", "big"]
    assert [c["id"] for c in chunk_rows(data_dir, object_key, "other")] == ["big"]
    # a cleared session starts again at seq 1 with a root
    result = session.append_message(text_message("n"))
    assert result.parent_id is None
    assert [(r["id"], r["seq"]) for r in message_rows(data_dir, object_key)] == [("n", 1)]
    assert session.clear_messages() == 1
    assert session.clear_messages() == 0


def test_delete_and_clear_are_refused_while_the_object_moves(live_server: Any, stub: Any, object_key: str) -> None:
    """A removal after a move's snapshot would be undone on the new owner: like appends, deletes
    and clears are refused (UNAVAILABLE / OBJECT_MOVING) until the lock is released."""
    with SessionsClient(live_server.address, retry=None) as client:
        session = client.object(object_key).session()
        session.append_messages([text_message("a"), text_message("b")])
        export = pb.ExportObjectRequest(object_key=object_key, lock_for_move=True, lease_seconds=3600)
        assert b"".join(frame.data for frame in stub.ExportObject(export))
        try:
            for remove in (lambda: session.delete_messages(["a"]), session.clear_messages):
                with pytest.raises(SessionsError) as refused:
                    remove()
                assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.UNAVAILABLE, "OBJECT_MOVING")
            assert ids(session.get_history()) == ["a", "b"]
        finally:
            stub.AbortMove(pb.AbortMoveRequest(object_key=object_key))
        assert session.delete_messages(["a"]) == 1
        assert session.clear_messages() == 1


def test_delete_and_clear_make_room_in_a_full_object(tmp_path: Path) -> None:
    """The object size limit refuses what would add, never what removes; what a delete or a
    clear frees is room again (the file kept its size, and writes were refused for good)."""
    filler = start_server(tmp_path / "data")
    try:
        with SessionsClient(filler.address) as client:
            client.object("full").session().append_messages(
                [text_message(f"m{i}", "x" * 300_000) for i in range(5)]  # 1.5 MB
            )
    finally:
        filler.stop()
    server = start_server(tmp_path / "data", limits=Limits(max_object_bytes=1024 * 1024))
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("full").session()
            with pytest.raises(SessionsError) as full:
                session.append_message(text_message("more"))
            assert full.value.reason == "LIMIT_EXCEEDED"
            assert "delete messages or clear sessions to make room" in full.value.message
            assert session.delete_messages(["m0"]) == 1
            assert session.clear_messages() == 4
            # The file keeps its size; the pages it freed are room again.
            assert client.object("full").get_object_stats().file_bytes > 1024 * 1024
            session.append_messages([text_message(f"n{i}", "x" * 300_000) for i in range(4)])  # 1.2 MB
            assert len(session.get_history()) == 4
            with pytest.raises(SessionsError) as full_again:  # past the limit again
                session.append_message(text_message("o"))
            assert full_again.value.reason == "LIMIT_EXCEEDED"
    finally:
        server.stop()
    server = start_server(tmp_path / "data", limits=Limits(max_object_bytes=1024 * 1024))
    try:  # after a restart too
        with SessionsClient(server.address, retry=None) as client:
            client.object("full").session().clear_messages()
            client.object("full").session().append_message(text_message("after"))
    finally:
        server.stop()


@pytest.mark.parametrize("fill", ["x", "😀"], ids=["ascii", "four-byte"])
def test_a_burst_of_writes_is_held_to_the_object_size_limit(tmp_path: Path, fill: str) -> None:
    """The file is measured at most once a second: writes in between counted for nothing, and a
    burst of 90 KB appends took a 1 MB object to 6-10 MB. What each write adds now counts until
    the next measurement, in bytes (counted in characters, 4-byte text passed it fivefold)."""
    limit, size = 1_000_000, 90_000
    server = start_server(tmp_path / "data", limits=Limits(max_object_bytes=limit))
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("bursting").session()
            accepted = 0
            with pytest.raises(SessionsError) as full:
                for i in range(60):
                    session.append_message(text_message(f"m{i}", fill * (size // len(fill.encode()))))
                    accepted += 1
            assert full.value.reason == "LIMIT_EXCEEDED"
            assert accepted <= limit // size + 1
    finally:
        server.stop()


@pytest.mark.parametrize("fill", ["x", "😀"], ids=["ascii", "four-byte"])
def test_an_import_stream_is_held_to_the_object_size_limit(tmp_path: Path, fill: str) -> None:
    """Only an import's first message was checked against the limit (as it opened the object):
    one stream of 300 messages of 100 KB took a 1 MB object to 46 MB. Each message is checked
    now; those before the refusal stay imported, in order (an import is not all or nothing)."""
    limit, size = 1_000_000, 100_000
    server = start_server(tmp_path / "data", limits=Limits(max_object_bytes=limit))
    messages = [text_message(f"m{i}", fill * (size // len(fill.encode()))) for i in range(300)]
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("importing").session()
            with pytest.raises(SessionsError) as full:
                session.import_messages(messages)  # each parented to the one before
            assert (full.value.code, full.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
            kept = session.get_history()
            assert kept == messages[: len(kept)]
            assert 0 < len(kept) <= limit // size + 1
            assert client.object("importing").get_object_stats().file_bytes < 2 * limit
    finally:
        server.stop()


def test_object_stats_count_the_free_pages_deletes_leave_and_writes_reuse(obj: Any, session: Any) -> None:
    """The file keeps its size after a delete; `free_bytes` says how much of it is free, so an
    operator can tell an object worth rewriting (docs/operations.md) from one that is full."""
    session.append_messages([text_message(f"m{i}", "x" * 300_000) for i in range(10)])  # 3 MB
    written = obj.get_object_stats()
    assert written.free_bytes < 100_000

    assert session.delete_messages([f"m{i}" for i in range(8)]) == 8
    deleted = obj.get_object_stats()
    assert deleted.free_bytes >= 8 * 300_000
    assert deleted.free_bytes < deleted.file_bytes

    session.append_messages([text_message(f"n{i}", "y" * 300_000) for i in range(4)])
    assert 3 * 300_000 < deleted.free_bytes - obj.get_object_stats().free_bytes < 6 * 300_000  # reused


def _object_bytes(data_dir: Path, object_key: str) -> bytes:
    """The object's file and WAL, as they are on disk."""
    path = object_path(data_dir, object_key)
    wal = Path(f"{path}-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def test_vacuum_gives_the_disk_back_what_deletes_freed_and_keeps_every_row(tmp_path: Path) -> None:
    """Deleting 90% of an object left its file at its size (the pages free for later writes)
    and exports and moves shipped them; VacuumObject rewrites it with the pages in use."""
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            obj = client.object("spacious")
            session = obj.session()
            gone = "qzdeletedqz "  # a word of the messages deleted below only
            session.append_messages(
                [text_message(f"m{i}", f"word{i} {gone if i < 54 else ''}" + "x" * 100_000) for i in range(60)]
            )
            assert len(session.search("word3")) == 1  # the search index exists, and gets merged
            assert session.delete_messages([f"m{i}" for i in range(54)]) == 54
            kept = session.get_history()
            deleted = obj.get_object_stats()
            assert deleted.free_bytes > 5_000_000
            # The search index still holds the deleted messages' words (FTS5 keeps a delete as
            # an entry of its own until its segments merge), and free pages may hold their text.
            assert b"qzdeletedqz" in _object_bytes(tmp_path / "data", "spacious")
            # An export (a move's too) copies only the pages in use.
            exported = export_file(client, "spacious", tmp_path / "exported.sqlite")
            assert exported.size_bytes <= deleted.file_bytes - deleted.free_bytes
            assert exported.size_bytes < 2_000_000

            report = obj.vacuum()
            stats = obj.get_object_stats()
            assert report.file_bytes_before == deleted.file_bytes
            assert report.file_bytes_after == stats.file_bytes < deleted.file_bytes - 5_000_000
            assert stats.free_bytes == 0
            assert session.get_history() == kept
            assert [hit.id for hit in session.search("word57")] == ["m57"]
            assert session.search("word3") == []
            assert b"qzdeletedqz" not in _object_bytes(tmp_path / "data", "spacious")
            session.append_message(text_message("after", "written after the rewrite"))
            assert ids(session.get_history()) == [*ids(kept), "after"]

            with pytest.raises(SessionsError) as absent:
                client.object("never-written").vacuum()
            assert absent.value.code == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop()
    restarted = start_server(tmp_path / "data")  # and the rewritten file is what a restart opens
    try:
        with SessionsClient(restarted.address) as client:
            assert ids(client.object("spacious").session().get_history()) == [*ids(kept), "after"]
    finally:
        restarted.stop()


def test_writes_and_reads_made_while_an_object_is_vacuumed_are_all_kept(tmp_path: Path) -> None:
    """A vacuum runs on the object's writer between two commits: writes queued meanwhile commit
    after it, reads go on; no acknowledged write is lost to the pages it writes back."""
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            obj = client.object("busy")
            session = obj.session()
            session.append_messages([text_message(f"old{i}", "x" * 100_000) for i in range(100)])
            session.delete_messages([f"old{i}" for i in range(90)])
            written: list[list[str]] = [[] for _ in range(4)]
            reads: list[int] = []
            vacuums: list[int] = []

            def writer(index: int) -> None:
                for n in range(60):
                    message_id = f"w{index}-{n}"
                    session.append_message(text_message(message_id, "y" * 20_000), parent_id=None)
                    written[index].append(message_id)

            def reader() -> None:
                for _ in range(30):
                    reads.append(len(session.get_history()))

            def vacuumer() -> None:
                for _ in range(5):
                    vacuums.append(obj.vacuum().file_bytes_after)

            threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
            threads += [threading.Thread(target=reader), threading.Thread(target=vacuumer)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

            assert len(vacuums) == 5 and len(reads) == 30
            stored = {m["id"] for m in session.get_messages([m for ids_ in written for m in ids_])}
            assert stored == {m for ids_ in written for m in ids_}  # every acknowledged append
            assert obj.get_object_stats().message_rows == 10 + 4 * 60
    finally:
        server.stop()
    with contextlib.closing(sqlite3.connect(object_path(tmp_path / "data", "busy"))) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
