"""Through gRPC: a lone client's quick reads (the active leaf, the steps of a newest-first walk)
run without the hop to the executor, and any other call in flight sends them back to it
(storage/store.py `ObjectStore.read`)."""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sessions_client import SessionsClient
from sessions_server.storage import store as store_module
from tests.conftest import start_server
from tests.service.support import text_message
from tests.service.test_lone_writes import a_server_with_two_sessions, an_append_waiting_for_a_lock


@pytest.fixture(autouse=True)
def any_read_is_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow read on a busy machine would send the next quick reads to the executor (by design,
    see tests/storage/test_read_threads.py); here only the choice of the reads is under test."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)


def test_a_lone_clients_leaf_and_newest_first_walk_read_in_place(tmp_path: Path) -> None:
    """A health Watch stays open meanwhile: like a change feed, it does not make the server busy."""
    server = start_server(tmp_path / "data")  # its own server: no other test's call in flight
    try:
        with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING  # the Watch is in flight
            session = client.object("lone").session()
            session.append_messages([text_message(f"m{i}") for i in range(30)])
            store = server.running.registry._open["lone"]
            before = store.inline_reads
            leaf = session.get_latest_leaf()
            newest = [m["id"] for m in itertools.islice(session.history(newest_first=True), 30)]
            whole = [m["id"] for m in session.get_history()]
            in_place = store.inline_reads - before
            watch.cancel()
    finally:
        server.stop()
    assert leaf is not None and leaf["id"] == "m29"
    assert newest == [f"m{i}" for i in reversed(range(30))]
    assert whole == [f"m{i}" for i in range(30)]
    # The leaf, the walk's reads of up to 4, 8, 16 and 32 rows, and the forward read's plan (a walk:
    # nothing remembered) with its one window (30 short messages), one read in one snapshot.
    assert in_place == 6


def test_an_open_reflection_stream_does_not_make_the_server_busy(tmp_path: Path) -> None:
    """Bidirectional streams (server reflection, as grpcurl holds one) stay open between
    requests like change feeds do, so they are not counted as calls in flight either."""
    server = start_server(tmp_path / "data")  # its own server: no other test's call in flight
    done = threading.Event()

    def requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        done.wait(60)  # the stream stays open until the test is done with it

    try:
        with SessionsClient(server.address) as client, grpc.insecure_channel(server.address) as channel:
            session = client.object("lone").session()
            session.append_message(text_message("only"))
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(requests(), timeout=60)
            assert next(reflection).HasField("list_services_response")  # the stream is in flight
            store = server.running.registry._open["lone"]
            before = store.inline_reads
            leaf = session.get_latest_leaf()
            in_place = store.inline_reads - before
            done.set()
            reflection.cancel()
    finally:
        done.set()
        server.stop()
    assert leaf is not None and leaf["id"] == "only"
    assert in_place == 1


def test_a_call_in_flight_sends_quick_reads_to_the_executor(tmp_path: Path) -> None:
    with a_server_with_two_sessions(tmp_path, "only") as (server, port, blocked, other):
        stores = server.running.registry._open
        with an_append_waiting_for_a_lock(tmp_path / "data", "blocked", blocked, port):
            while_busy = stores["other"].inline_reads
            leaf_while_busy = other.get_latest_leaf()
            busy_in_place = stores["other"].inline_reads - while_busy
        quiet = stores["other"].inline_reads
        leaf_when_quiet = other.get_latest_leaf()
        quiet_in_place = stores["other"].inline_reads - quiet
    assert leaf_while_busy is not None and leaf_while_busy["id"] == "only"
    assert leaf_when_quiet is not None and leaf_when_quiet["id"] == "only"
    assert (busy_in_place, quiet_in_place) == (0, 1)


def test_messages_read_by_id_run_in_place_unless_known_to_be_large(tmp_path: Path) -> None:
    """GetMessage and GetMessages windows are point reads, quick unless a message is megabytes:
    one written with continuation rows since the object opened, or one read whole before
    (domain/large_messages.py)."""
    big = {"id": "big", "role": "user", "parts": [{"type": "text", "text": "é" * 1_000_000}]}  # 2 MB of UTF-8
    expected = {"big": big, "small": text_message("small"), "other": text_message("other")}
    read_in_place: list[list[int]] = []

    def reads(session: Any, store: Any, asked: list[list[str]]) -> list[int]:
        """In-place reads per request: a list of one id is GetMessage, of more GetMessages."""
        counts = []
        for ids in asked:
            before = store.inline_reads
            found = [session.get_message(ids[0])] if len(ids) == 1 else session.get_messages(ids)
            assert found == [expected[message_id] for message_id in ids]
            counts.append(store.inline_reads - before)
        return counts

    asked = [["small"], ["big"], ["small", "other"], ["other", "big"], ["small"]]
    server = start_server(tmp_path / "data")  # its own server: no other test's call in flight
    try:
        with SessionsClient(server.address) as client:
            session = client.object("lone").session()
            session.append_messages([text_message("small"), text_message("other")])
            session.append_message(big)
            read_in_place.append(reads(session, server.running.registry._open["lone"], asked))
    finally:
        server.stop()
    server = start_server(tmp_path / "data")  # the object opens afresh: nothing is known of it
    try:
        with SessionsClient(server.address) as client:
            session = client.object("lone").session()
            session.get_latest_leaf()  # opens the object
            store = server.running.registry._open["lone"]
            read_in_place.append(reads(session, store, [["other", "big"], *asked]))
    finally:
        server.stop()
    assert read_in_place == [[1, 0, 1, 0, 1], [1, 1, 0, 1, 0, 1]]


def test_what_an_object_remembers_of_its_large_messages_does_not_grow_with_their_ids(tmp_path: Path) -> None:
    """Messages with inline media are remembered as large. The memo held their (session id,
    message id) pairs: 4,096 messages with 16 KiB ids held 66 MiB per open object, outside every
    memory budget. It holds a fixed-size entry per message, and still knows them."""
    long_id = "i" * 16_000
    image = {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"}
    messages = [{"id": f"{n}-{long_id}", "role": "user", "parts": [image]} for n in range(64)]
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            session = client.object("memo").session("s" * 1_000)
            session.append_messages(messages)
            store = server.running.registry._open["memo"]
            known = store.memo["large-messages"]
            assert len(known) == len(messages)
            held = sum(_deep_size(entry) for entry in known)
            assert held < 64 * len(messages), held  # about 32 bytes an entry; the ids are 1 MB
            before = store.inline_reads
            assert session.get_message(messages[5]["id"]) == messages[5]
            assert store.inline_reads == before  # known large: read on a worker thread
    finally:
        server.stop()


def _deep_size(value: object) -> int:
    inner = value if isinstance(value, tuple) else ()
    return sys.getsizeof(value) + sum(_deep_size(item) for item in inner)
