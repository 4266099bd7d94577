"""Through gRPC: a lone client's appends commit without the hop to the writer thread, and any
other call in flight sends writes back to it (storage/store.py `ObjectStore.write`).

The server counts the calls it is handling (`sessions_rpcs_in_flight`); change feeds, which
stay open idle for long, are not counted."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessions_client import SessionsClient
from sessions_server.storage import store as store_module
from tests.conftest import start_server
from tests.deploy.support import free_port
from tests.reliability.support import wait_until
from tests.service.support import text_message
from tests.service.test_feed import Feed
from tests.storage.upstream_schema import object_file


@pytest.fixture(autouse=True)
def any_disk_is_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow fsync on a busy machine would send the next writes to the thread (by design, see
    tests/storage/test_write_threads.py); here only the counting of calls is under test."""
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)


def unary_calls_in_flight(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    line = next(line for line in body.splitlines() if line.startswith("sessions_rpcs_in_flight "))
    return float(line.split()[1])


@contextlib.contextmanager
def an_append_waiting_for_a_lock(data_dir: Path, object_key: str, session: Any, metrics_port: int) -> Iterator[None]:
    """Another connection holds `object_key`'s write lock, so an append to it waits in flight
    (one call counted) until the block ends."""
    holder = sqlite3.connect(object_file(data_dir, object_key), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    waiting = threading.Thread(target=session.append_message, args=(text_message("waited"),))
    waiting.start()
    try:
        assert wait_until(lambda: unary_calls_in_flight(metrics_port) == 1, timeout=10)
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        waiting.join(timeout=30)
    assert wait_until(lambda: unary_calls_in_flight(metrics_port) == 0, timeout=10)


@contextlib.contextmanager
def a_server_with_two_sessions(tmp_path: Path, other_first_id: str) -> Iterator[tuple[Any, int, Any, Any]]:
    """(server, metrics port, session "blocked", session "other"), each session holding one
    message ("first", and `other_first_id`): for `an_append_waiting_for_a_lock` on "blocked"."""
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        with SessionsClient(server.address) as client:
            blocked, other = client.object("blocked").session(), client.object("other").session()
            blocked.append_message(text_message("first"))
            other.append_message(text_message(other_first_id))
            yield server, port, blocked, other
    finally:
        server.stop()


def test_a_lone_clients_appends_commit_in_place(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")  # its own server: no other test's call in flight
    try:
        with SessionsClient(server.address) as client:
            session = client.object("lone").session()
            feed = Feed(server.address, "lone")  # open from here on; a stream is not a call
            try:
                for i in range(10):
                    session.append_message(text_message(f"m{i}"))
                session.append_messages([text_message(f"b{i}") for i in range(5)])
                seen = [event.message["id"] for event in feed.take(15)]
            finally:
                feed.close()
            history = [m["id"] for m in session.get_history()]
        inline_writes = server.running.registry._open["lone"].inline_writes
    finally:
        server.stop()
    assert inline_writes == 11
    expected = [f"m{i}" for i in range(10)] + [f"b{i}" for i in range(5)]
    assert seen == expected
    assert history == expected


def test_a_call_in_flight_sends_other_writes_to_the_writer_thread(tmp_path: Path) -> None:
    with a_server_with_two_sessions(tmp_path, "first") as (server, port, blocked, other):
        assert unary_calls_in_flight(port) == 0
        with an_append_waiting_for_a_lock(tmp_path / "data", "blocked", blocked, port):
            other.append_message(text_message("second"))
        stores = server.running.registry._open
        assert (stores["blocked"].inline_writes, stores["other"].inline_writes) == (1, 1)
        assert [m["id"] for m in blocked.get_history()] == ["first", "waited"]
        assert [m["id"] for m in other.get_history()] == ["first", "second"]
