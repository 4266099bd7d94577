"""The server's idle spells: what counts as work, and when an idle action is due."""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_client import SessionsClient
from sessions_server.transport.idle import IdleWatch
from tests.conftest import start_server


def test_idle_is_said_once_per_quiet_spell_and_only_after_calls() -> None:
    watch = IdleWatch()
    assert [watch.idle_now(0, 0) for _ in range(3)] == [False] * 3  # never busy: nothing to give back
    assert watch.idle_now(5, 1) is False  # calls came since the last look
    assert watch.idle_now(5, 1) is False  # none started, but one still in flight
    assert watch.idle_now(5, 0) is True  # quiet now
    assert [watch.idle_now(5, 0) for _ in range(3)] == [False] * 3  # still the same spell
    assert watch.idle_now(6, 0) is False  # a call since: not quiet at this look
    assert watch.idle_now(6, 0) is True


def test_health_checks_do_not_count_as_work(tmp_path: Path) -> None:
    """A probe every few seconds must not keep the server from being idle (nor make it release
    after each probe); any other call counts, once."""
    server = start_server(tmp_path / "data")
    try:
        calls = server.running.calls
        with grpc.insecure_channel(server.address) as channel:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert calls.calls_started == 0
        with SessionsClient(server.address) as client:
            client.object("o").session().append_message({"id": "m1", "role": "user", "parts": []})
        assert calls.calls_started == 1
    finally:
        server.stop()
