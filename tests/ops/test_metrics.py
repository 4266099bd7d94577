"""The Prometheus endpoint reports RPCs by method and code, and object gauges."""

from __future__ import annotations

import contextlib
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sessions_client import SessionsClient, SessionsError
from tests.conftest import start_server
from tests.deploy.support import free_port
from tests.reliability.support import wait_until

SERVICE = 'service="sessions.v1.SessionService"'


def _scrape(port: int) -> str:
    return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())


def test_metrics_endpoint_counts_rpcs_and_objects(tmp_path: Path) -> None:
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        with SessionsClient(server.address) as client:
            session = client.object("metrics").session()
            session.append_message({"id": "m1", "role": "user", "parts": []})
            session.get_history()
            with pytest.raises(SessionsError):
                session.append_message("not json")
            planned = client.object("metrics").session("planned")
            planned.append_messages([{"id": f"p{i}", "role": "user", "parts": []} for i in range(12)])
            assert planned.plan_compaction(keep_recent_tokens=1) is not None  # held until used
        # A failed call is counted as its handler unwinds, which can be just after the client has
        # seen the status (grpc sends it from `abort`): read until it shows, within a bound.
        failed = (
            'sessions_rpcs_total{code="INVALID_ARGUMENT",method="AppendMessage",reason="INVALID_JSON",'
            'service="sessions.v1.SessionService"} 1.0'
        )
        scraped = [""]

        free_around: list[int] = []

        def counted() -> bool:
            free_around[:] = [shutil.disk_usage(tmp_path).free]
            scraped[0] = _scrape(port)
            free_around.append(shutil.disk_usage(tmp_path).free)
            return failed in scraped[0]

        assert wait_until(counted, timeout=10), scraped[0]
        body = scraped[0]
    finally:
        server.stop()
    assert f'sessions_rpcs_total{{code="OK",method="AppendMessage",reason="",{SERVICE}}} 1.0' in body
    assert f'sessions_rpcs_total{{code="OK",method="StreamHistory",reason="",{SERVICE}}} 1.0' in body
    assert "sessions_open_objects 1.0" in body
    assert "sessions_held_compaction_plans 1.0" in body
    assert "sessions_open_object_row_writes 13.0" in body
    assert f'sessions_rpc_seconds_count{{method="AppendMessage",{SERVICE}}} 2.0' in body
    assert f'sessions_rpcs_total{{code="OK",method="PlanCompaction",reason="",{SERVICE}}} 1.0' in body
    # What memory and the open-objects bound are sized by, and which version answers.
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_max_fds"):
        assert any(line.startswith(name + " ") and float(line.split()[1]) > 0 for line in body.splitlines()), name
    assert 'sessions_build_info{version="' in body
    # What the server remembers of recent reads (the history read above), apart from the rest of
    # its memory: paths and messages were remembered, each within its budget.
    memo = {
        line.split('"')[1]: float(line.split()[1])
        for line in body.splitlines()
        if line.startswith("sessions_memo_bytes{")
    }
    assert set(memo) == {"paths", "messages", "responses"}, memo
    assert 0 < memo["paths"] <= 64 * 1024 * 1024 and 0 < memo["messages"] <= 96 * 1024 * 1024, memo
    # How close the data directory's file system is to refusing writes, as the system tells it.
    (free,) = [float(line.split()[1]) for line in body.splitlines() if line.startswith("sessions_data_dir_free_bytes ")]
    assert min(free_around) - 16 * 1024 * 1024 <= free <= max(free_around) + 16 * 1024 * 1024, (free, free_around)


def test_fresh_request_ids_are_distinct_and_short() -> None:
    """Calls without an `x-request-id` get one of 16 hex characters, never the same twice."""
    from sessions_server.transport.metrics import _fresh_request_id

    ids = [_fresh_request_id() for _ in range(1_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


def test_a_stopped_server_gives_its_metrics_port_back(tmp_path: Path) -> None:
    """The HTTP endpoint outlived its server: it kept answering for a closed registry, and a
    server started again in the same process on the same address failed to bind."""
    import urllib.error

    port = free_port()
    first = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        assert "sessions_open_objects" in _scrape(port)
    finally:
        first.stop()
    with pytest.raises(urllib.error.URLError):
        _scrape(port)
    second = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        assert "sessions_open_objects" in _scrape(port)
    finally:
        second.stop()


def test_json_log_lines_carry_a_utc_time_with_milliseconds() -> None:
    """The time was local, to the second and without a zone: lines of one second could not be
    ordered, nor joined with other services' logs."""
    import json
    import logging
    import re

    from sessions_server.transport.metrics import JsonFormatter

    record = logging.LogRecord("sessions", logging.WARNING, __file__, 1, "disk %s", ("full",), None)
    record.created = 1_764_000_000.1234
    entry = json.loads(JsonFormatter().format(record))
    assert entry["time"] == "2025-11-24T16:00:00.123Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    assert (entry["level"], entry["message"]) == ("WARNING", "disk full")


def _logged_by_grpc(failure: BaseException) -> Any:
    import logging

    try:
        raise failure
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord(
        "grpc._cython.cygrpc",
        logging.ERROR,
        __file__,
        1,
        "ExecuteBatchError raised in core by servicer method [%s]",
        ("/sessions.v1.SessionService/GetRecentHistory",),
        exc_info,
    )


def test_a_status_that_could_not_reach_a_departed_client_is_logged_at_debug_only() -> None:
    """gRPC logged an ERROR with a traceback when a call's deadline passed just before its status
    was sent; such a refused status batch is kept at DEBUG, and every other failure stays an ERROR:
    a unary answer refused before its deadline (one past the send limit) among them."""
    import logging

    from grpc._cython import cygrpc

    from sessions_server.transport.metrics import EndedCallFilter, serving

    quiet = EndedCallFilter()
    core = logging.getLogger("grpc._cython.cygrpc")
    ended = cygrpc.ExecuteBatchError(
        'Failed "execute_batch": (<grpc._cython.cygrpc.SendStatusFromServerOperation object at 0x1>,)'
    )
    answer = cygrpc.ExecuteBatchError(
        'Failed "execute_batch": (<grpc._cython.cygrpc.SendMessageOperation object at 0x1>, '
        "<grpc._cython.cygrpc.SendStatusFromServerOperation object at 0x2>,)"
    )
    misuse = cygrpc.ExecuteBatchError(
        "Failed grpc_call_start_batch: 8 with grpc_call_error value: 'GRPC_CALL_ERROR_TOO_MANY_OPERATIONS'"
    )

    previous = core.level
    try:
        core.setLevel(logging.INFO)
        record = _logged_by_grpc(ended)
        assert quiet.filter(record) is False
        core.setLevel(logging.DEBUG)
        record = _logged_by_grpc(ended)
        assert quiet.filter(record) is True
        assert (record.levelname, record.exc_info) == ("DEBUG", None)
        assert record.getMessage() == (
            "ExecuteBatchError raised in core by servicer method [/sessions.v1.SessionService/GetRecentHistory]"
            ": the call ended before its status could be sent"
        )
        for kept in (misuse, RuntimeError("SendStatusFromServerOperation"), answer):
            record = _logged_by_grpc(kept)
            assert quiet.filter(record) is True
            assert record.levelname == "ERROR" and record.exc_info is not None
        # A unary answer refused once its deadline passed: the client had gone; before it, not.
        for remaining, level in ((0.0, "DEBUG"), (60.0, "ERROR")):
            call = serving.set(_Deadline(remaining))
            try:
                record = _logged_by_grpc(answer)
                assert quiet.filter(record) is True and record.levelname == level
            finally:
                serving.reset(call)
    finally:
        core.setLevel(previous)


class _Deadline:
    """What the filter asks of the call being served: the seconds left before its deadline
    (gRPC's `time_remaining`, never below 0)."""

    def __init__(self, remaining: float) -> None:
        self._remaining = remaining

    def time_remaining(self) -> float:
        return self._remaining


def _get(port: int, path: str) -> int:
    import urllib.error

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as page:
            return int(page.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_the_endpoint_serves_the_metrics_at_metrics_only_and_no_created_series(tmp_path: Path) -> None:
    """Every path answered 200 with the metrics (`/`, `/healthz`, a typo), so a health check or a
    mistyped scrape path looked fine; and each counter and histogram had a `*_created` series
    beside it, twice the series for nothing Prometheus reads."""
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        with SessionsClient(server.address) as client:
            client.object("created").session().append_message({"id": "m1", "role": "user", "parts": []})
        assert {path: _get(port, path) for path in ("/", "/healthz", "/nope", "/metrics/", "/metrics")} == {
            "/": 404,
            "/healthz": 404,
            "/nope": 404,
            "/metrics/": 404,
            "/metrics": 200,
        }
        body = _scrape(port)
    finally:
        server.stop()
    assert "sessions_rpcs_total{" in body and "sessions_rpc_seconds_count{" in body
    assert "_created" not in body, [line for line in body.splitlines() if "_created" in line][:5]


def test_the_service_tells_health_calls_from_sessions_calls(tmp_path: Path) -> None:
    """The method label alone put health's `Check` beside SessionService's methods; a service
    label tells them apart (and `method` stays the short name dashboards already use)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        with grpc.insecure_channel(server.address) as channel:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        body = _scrape(port)  # a unary call is counted before its answer is sent
    finally:
        server.stop()
    assert 'sessions_rpcs_total{code="OK",method="Check",reason="",service="grpc.health.v1.Health"} 1.0' in body
    assert 'sessions_rpc_seconds_count{method="Check",service="grpc.health.v1.Health"} 1.0' in body


class _Answered:
    """What the meter reads of a call it counts: the trailing metadata of its status."""

    def __init__(self, trailing: tuple[tuple[str, Any], ...]) -> None:
        self._trailing = trailing

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._trailing


def test_the_reason_label_is_the_refusals_error_info_reason_bounded_to_the_contracts_names() -> None:
    """STORAGE_FAILURE, DRAINING, OBJECT_MOVING and SERVER_BUSY are all UNAVAILABLE: the code
    alone could not tell a broken disk from a drain. The reason is taken only from the contract's
    ErrorReason names, so a value never seen before cannot make a series of its own."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    from sessions_server.domain import errors
    from sessions_server.transport.errors import status_for
    from sessions_server.transport.metrics import KNOWN_REASONS, reason_of

    refusals: dict[str, errors.SessionsError] = {
        "STORAGE_FAILURE": errors.StorageFailure("disk gone"),
        "DRAINING": errors.Unavailable("shutting down"),
        "OBJECT_MOVING": errors.Unavailable("moving", reason="OBJECT_MOVING"),
        "SERVER_BUSY": errors.Unavailable("busy", reason="SERVER_BUSY"),
    }
    for reason, refusal in refusals.items():
        status = status_for(refusal)
        assert status.code.name == "UNAVAILABLE"
        assert reason_of(_Answered(tuple(status.trailing_metadata))) == reason

    def answered(reason: str) -> _Answered:
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="sessions.v1"))
        status = status_pb2.Status(code=14, message="x", details=[packed])
        return _Answered((("grpc-status-details-bin", status.SerializeToString()),))

    assert reason_of(answered("SOMETHING_NEW")) == "OTHER"
    assert reason_of(answered("draining")) == "OTHER"  # names match exactly
    assert reason_of(_Answered(())) == ""  # a status without details (gRPC's own, health's)
    assert reason_of(_Answered((("grpc-status-details-bin", b"\xff\xff"),))) == "OTHER"
    assert {"STORAGE_FAILURE", "DRAINING", "OBJECT_MOVING", "SERVER_BUSY", "INTERNAL"} <= KNOWN_REASONS
    assert "UNSPECIFIED" not in KNOWN_REASONS


def test_row_writes_total_is_a_counter_that_never_goes_down() -> None:
    """`sessions_row_writes` was a gauge summed over the open objects: it dropped with every
    close (LRU eviction), and `rate()` of it meant nothing. `sessions_row_writes_total` counts
    what this process wrote, closed objects' included, and never goes down."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sessions_server.transport.metrics import Metrics

    metrics = Metrics()
    written = [0]

    def families() -> dict[str, Any]:
        text = generate_latest(metrics.registry).decode()
        return {family.name: family for family in text_string_to_metric_families(text)}

    assert "sessions_row_writes" not in families()  # no source yet: left out, never shown wrong
    metrics.row_writes_total.set_function(lambda: written[0])
    seen = []
    for value in (0, 13, 20, 17, 25):  # 17: a store read between open and closed, say
        written[0] = value
        family = families()["sessions_row_writes"]
        assert family.type == "counter"
        (sample,) = family.samples
        assert sample.name == "sessions_row_writes_total"
        seen.append(sample.value)
    assert seen == [0, 13, 20, 20, 25]
    assert families()["sessions_open_object_row_writes"].type == "gauge"  # the gauge, renamed


class _Served:
    """What the meter reads of a call's servicer context: no status set by the handler, and
    `remaining` seconds to its deadline (None: no deadline)."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining

    def code(self) -> None:
        return None

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def trailing_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def test_a_call_is_counted_by_the_status_its_client_saw_when_its_deadline_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gRPC tells the client DEADLINE_EXCEEDED once the deadline passes: a handler cancelled for it
    was counted CANCELLED, as if the client had given up, and one that answered well after it OK
    (deadlines and cancellation audit, session 49). An answer just after it still reaches the
    client (gRPC's timer had not fired): OK. The meter's clock is the test's."""
    import asyncio
    import time

    import grpc
    from prometheus_client import generate_latest

    from sessions_server.transport.metrics import LATE_ANSWER_SECONDS, CallMeter, Metrics

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    metrics = Metrics()
    meter = CallMeter(metrics)

    def answers_after(seconds: float) -> Any:
        async def answers(request: object, context: object) -> str:
            clock[0] += seconds
            return "answer"

        return answers

    async def is_cancelled(request: object, context: object) -> str:
        raise asyncio.CancelledError

    method = "/sessions.v1.SessionService/AppendMessage"
    calls = (
        (answers_after(1.0), None),
        (answers_after(1.0), 0.5),  # well past the deadline
        (answers_after(1.0), 1.0 - LATE_ANSWER_SECONDS / 2),  # a little past it: the answer still went
        (is_cancelled, 0.0),
        (is_cancelled, 5.0),
    )

    async def run() -> None:
        for handler, remaining in calls:
            behavior = meter.metered(method, grpc.unary_unary_rpc_method_handler(handler)).unary_unary
            assert behavior is not None
            with contextlib.suppress(asyncio.CancelledError):
                await behavior(None, _Served(remaining))

    asyncio.run(run())
    counted = {
        line.split('code="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line.startswith("sessions_rpcs_total{")
    }
    assert counted == {"OK": 2.0, "DEADLINE_EXCEEDED": 2.0, "CANCELLED": 1.0}
