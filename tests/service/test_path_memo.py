"""Reads served from the remembered path agree with reads of a freshly opened object.

The server remembers each session's last walked path and extends it on appends to its leaf,
and the messages read along it, adding appended ones (domain/paths.py). Here every step
compares what the open object answers (remembered path and messages) with what it answers
after being closed and reopened (a fresh walk): row stats, history root first (inline and with
attachment pointers) and newest first (against a walk from the leaf), recent history, for the
active leaf and for explicit leaves, across appends, branches, updates, deletes, compactions,
attachments and non-ASCII content.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_client._common import routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from tests.conftest import LiveServer, start_server
from tests.reliability.support import wait_until
from tests.service.support import text_message


@pytest.fixture(scope="module")
def one_open_object(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server that keeps a single object open: touching another closes the previous one."""
    server = start_server(tmp_path_factory.mktemp("memo"), max_open_objects=1)
    yield server
    server.stop()


class Pair:
    """The session under test and a second object whose use closes (hibernates) the first."""

    def __init__(self, client: SessionsClient, address: str) -> None:
        self.address = address
        self.key = f"memo-{uuid.uuid4().hex}"
        self.session = client.object(self.key).session()
        self.other = client.object(f"other-{uuid.uuid4().hex}").session()

    def reads(self, leaf_id: str | None) -> tuple[Any, ...]:
        recent = [self.session.get_recent_history(budget, leaf_id=leaf_id) for budget in (3_000, 10**12)]
        return (
            self.session.get_history_row_stats(leaf_id=leaf_id),
            undated(self.session.get_history(leaf_id=leaf_id)),
            undated(self.session.get_history(leaf_id=leaf_id, pointers=True)),
            undated(self.session.get_history(leaf_id=leaf_id, newest_first=True)),
            [(undated(r.messages), r.truncated, r.total_content_bytes) for r in recent],
            self.packed_by_three(leaf_id),
        )

    def packed_by_three(self, leaf_id: str | None) -> list[dict[str, Any]]:
        """History three messages at most per response: a remembered read sends the responses it
        kept from the reads before, which must still be the right ones. (Where a read cuts its
        responses may differ: past the depth cap, a read starting one row later stops its first
        response where a kept one begins.)"""
        request = pb.StreamHistoryRequest(object_key=self.key, leaf_id=leaf_id or "", max_messages_per_response=3)
        with grpc.insecure_channel(self.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            responses = list(stub.StreamHistory(request, metadata=routing_metadata(self.key)))
        assert all(1 <= len(response.frames) <= 3 for response in responses)
        return undated([json.loads(frame.json) for response in responses for frame in response.frames])

    def check(self, leaf_id: str | None = None) -> None:
        """Reads while open (the path and messages remembered from earlier reads and appends),
        again (all from the memo), then after a reopen."""
        self.session.get_history_row_stats(leaf_id=leaf_id)
        remembered = self.reads(leaf_id)
        assert self.reads(leaf_id) == remembered
        self.other.get_latest_leaf()  # closes the session's object: its memos are gone
        fresh = self.session.get_history_row_stats(leaf_id=leaf_id)
        assert remembered[0] == fresh
        self.other.get_latest_leaf()
        walked = undated(self.session.get_history(leaf_id=leaf_id, newest_first=True))  # leaf to root
        assert remembered[3] == walked
        self.other.get_latest_leaf()
        assert remembered == self.reads(leaf_id)


def undated(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Overlays carry the time of the read as `createdAt` (as upstream's): left out here."""
    return [{k: v for k, v in m.items() if k != "createdAt"} for m in messages]


def image_part(seed: int) -> dict[str, Any]:
    data = bytes((seed * 31 + i) % 251 for i in range(3_000))
    return {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64," + base64.b64encode(data).decode()}


def test_remembered_paths_match_fresh_walks(one_open_object: LiveServer, tmp_path: Path) -> None:
    with SessionsClient(one_open_object.address) as client:
        pair = Pair(client, one_open_object.address)
        session = pair.session
        session.append_messages([text_message(i, f"text {i}") for i in ("a", "b", "c")])
        pair.check()

        session.append_message(text_message("d", "tail append"))  # extends the remembered path
        pair.check()
        pair.check(leaf_id="b")

        session.append_message(text_message("e", "branch from b"), parent_id="b")
        pair.check()
        pair.check(leaf_id="d")

        session.append_messages([text_message("f", "ünïcödé 🎉 " * 40), text_message("g", "ascii")])
        pair.check()

        session.append_message({"id": "h", "role": "user", "parts": [image_part(1)]})
        pair.check()
        session.append_message(text_message("i", "after the image"))
        pair.check()
        for _ in range(2):  # the second pair of reads is served from the memo
            [inline] = [m for m in session.get_history() if m["id"] == "h"]
            [pointer] = [m for m in session.get_history(pointers=True) if m["id"] == "h"]
            assert inline["parts"][0]["url"] == image_part(1)["url"]
            assert pointer["parts"][0]["url"].startswith("attachment:sha256:")

        session.update_message(text_message("b", "b rewritten, longer than before " * 10))
        pair.check()

        session.add_compaction("summary of a..b", "a", "b")
        pair.check()
        session.append_message(text_message("j", "after the compaction"))
        pair.check()

        session.delete_messages(["f"])
        pair.check()
        session.append_message(text_message("k", "after the delete"))
        pair.check()
        assert [m["id"] for m in session.get_history()][-3:] == ["i", "j", "k"]


def test_a_hidden_row_that_ends_a_compaction_is_walked_through_newest_first(one_open_object: LiveServer) -> None:
    """A compaction may end at a hidden row (an echoed overlay: `AddCompaction` checks no ids).
    No plan draws that span, so a newest-first walk goes on through the row, as the root-first
    read does, whether the path is remembered or walked afresh (upstream's walk stops there)."""
    with SessionsClient(one_open_object.address) as client:
        pair = Pair(client, one_open_object.address)
        session = pair.session
        session.append_messages([text_message("a", "first"), text_message("b", "second")])
        record = session.add_compaction("s", "none", "none")
        hidden = "compaction_" + record.id
        session.import_message(text_message(hidden, "echoed", role="assistant"), parent_id="b", created_at=1)
        session.add_compaction("t", "a", hidden)
        session.append_message(text_message("c", "under the hidden row"))
        pair.other.get_latest_leaf()  # a fresh walk first
        assert [m["id"] for m in session.get_history(newest_first=True)] == ["c", "b", "a"]
        assert [m["id"] for m in session.get_history()] == ["a", "b", "c"]
        pair.check()
        pair.check(leaf_id=hidden)


def test_remembered_paths_at_the_depth_cap_match_fresh_walks(one_open_object: LiveServer) -> None:
    """Past 10,001 rows a walk stops at the cap; each append then pushes the oldest row out of it
    (and recent history reports `truncated` for the cap)."""
    with SessionsClient(one_open_object.address) as client:
        pair = Pair(client, one_open_object.address)
        for start in range(0, 10_001, 1_000):
            count = min(1_000, 10_001 - start)
            pair.session.append_messages([text_message(f"m{i:05d}", f"t{i}") for i in range(start, start + count)])
        pair.check()  # exactly at the cap: the whole path, not truncated
        assert not pair.session.get_recent_history(10**12).truncated
        pair.session.append_message(text_message("over-1", "one past the cap"))
        pair.check()
        pair.session.append_messages([text_message("over-2"), text_message("over-3")])
        pair.check()
        stats = pair.session.get_history_row_stats()
        assert len(stats) == 10_001 and stats[0].id == "m00003" and stats[-1].id == "over-3"
        assert pair.session.get_recent_history(10**12).truncated


def test_remembered_paths_stay_right_under_concurrent_appends_and_reads(one_open_object: LiveServer) -> None:
    """Writers append (tail and branch) while readers read: what the memo holds at the end still
    matches a fresh walk, and every reader saw a root-first path ending at some committed row."""
    with SessionsClient(one_open_object.address) as client:
        pair = Pair(client, one_open_object.address)
        pair.session.append_message(text_message("root"))
        errors: list[str] = []
        reads_done: list[int] = []
        reads, writes = 40, 40

        def write(worker: int) -> None:
            try:
                for n in range(writes):
                    parent: Any = "root" if n % 10 == 9 else None  # now and then a branch from the root
                    message = text_message(f"w{worker}-{n}", f"{worker}/{n}")
                    if parent is None:
                        pair.session.append_message(message)
                    else:
                        pair.session.append_message(message, parent_id=parent)
            except Exception as error:  # reported by the test thread
                errors.append(f"writer {worker}: {error!r}")

        key = pair.key
        channel = grpc.insecure_channel(one_open_object.address)
        stub = sessions_pb2_grpc.SessionServiceStub(channel)

        def read(reader: int) -> None:
            # Root first, each row's parent is the row before it: the remembered path is a real
            # chain, whichever appends it was extended by.
            try:
                for _ in range(reads):
                    request = pb.StreamHistoryRequest(object_key=key, max_messages_per_response=128)
                    infos = [
                        frame.info
                        for response in stub.StreamHistory(request, metadata=routing_metadata(key))
                        for frame in response.frames
                    ]
                    parents = [info.parent_id for info in infos[1:]]
                    if not infos or parents != [info.id for info in infos[:-1]] or infos[0].id != "root":
                        errors.append(f"not a chain: {[(i.id, i.parent_id) for i in infos]}")
                    reads_done.append(reader)
            except Exception as error:  # reported by the test thread
                errors.append(f"reader {reader}: {error!r}")

        threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
        threads += [threading.Thread(target=read, args=(r,)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        channel.close()
        assert not [thread.name for thread in threads if thread.is_alive()], "threads still running"
        assert not errors, errors[:3]
        assert sorted(reads_done) == sorted([0, 1] * reads)  # every reader completed every read
        pair.check()


@pytest.mark.parametrize("write", ["update", "delete", "append"])
def test_a_write_whose_caller_gave_up_still_updates_what_reads_remember(tmp_path: Path, write: str) -> None:
    """A write commits even when its caller is cancelled once a commit took its job (a job still
    queued is dropped: test_write_threads). What the server remembers of the session was brought
    up to date by the caller after its await, which a cancelled caller never reached: reads kept
    answering the old text of an updated message, or a deleted one, from memory."""
    server = start_server(tmp_path / "data")
    key, first_gate, second_gate = "gave-up", threading.Event(), threading.Event()
    try:
        with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
            session = client.object(key).session()
            session.append_messages([text_message("a"), text_message("b", "old"), text_message("c")])
            assert [m["id"] for m in session.get_history()] == ["a", "b", "c"]  # now remembered

            holding: list[Any] = []
            first_running, second_running = threading.Event(), threading.Event()

            def holder(running: threading.Event, gate: threading.Event) -> Callable[[Any], None]:
                def hold(ctx: Any) -> None:
                    running.set()
                    gate.wait(30)

                return hold

            async def hold_the_writer(running: threading.Event, gate: threading.Event) -> None:
                async with server.running.registry.use(key) as store:  # writes of the object's
                    holding.append(store)
                    await store.write(holder(running, gate))

            first = asyncio.run_coroutine_threadsafe(hold_the_writer(first_running, first_gate), server.loop)
            assert first_running.wait(30), "the first holding write never ran"
            second = asyncio.run_coroutine_threadsafe(hold_the_writer(second_running, second_gate), server.loop)
            assert wait_until(lambda: holding[0].queued_writes == 1, 30), "the second holding write never queued"
            stub, metadata = sessions_pb2_grpc.SessionServiceStub(channel), routing_metadata(key)
            if write == "update":
                call = stub.UpdateMessage.future(
                    pb.UpdateMessageRequest(object_key=key, message_json=json.dumps(text_message("b", "new"))),
                    metadata=metadata,
                )
            elif write == "delete":
                call = stub.DeleteMessages.future(
                    pb.DeleteMessagesRequest(object_key=key, message_ids=["b"]), metadata=metadata
                )
            else:
                call = stub.AppendMessage.future(
                    pb.AppendMessageRequest(object_key=key, message_json=json.dumps(text_message("d"))),
                    metadata=metadata,
                )
            assert wait_until(lambda: holding[0].queued_writes == 2, 30), "the call's write never queued"
            first_gate.set()  # the next commit takes the second holding write and the call's
            assert second_running.wait(30), "the second holding write never ran"
            call.cancel()  # its job in a commit already
            assert wait_until(lambda: server.running.calls.calls_in_flight == 0, 30), "the server kept the call"
            second_gate.set()
            first.result(timeout=30)
            second.result(timeout=30)
            asyncio.run_coroutine_threadsafe(holding[0].settled(), server.loop).result(timeout=30)

            expected = {
                "update": [("a", "hi"), ("b", "new"), ("c", "hi")],
                "delete": [("a", "hi"), ("c", "hi")],
                "append": [("a", "hi"), ("b", "old"), ("c", "hi"), ("d", "hi")],
            }[write]
            history = [(m["id"], m["parts"][0]["text"]) for m in session.get_history()]
            assert history == expected  # committed, and read as committed
    finally:
        first_gate.set()
        second_gate.set()
        server.stop()
