"""The metrics tell refusals of one code apart by their ErrorInfo reason: a drain and a broken
disk were both `code="UNAVAILABLE"` and nothing more. And rows written are counted (a counter,
closed objects' rows included), not summed over the objects open at the moment."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from tests.conftest import start_server
from tests.deploy.support import free_port
from tests.reliability.support import wait_until
from tests.service.support import text_message

SERIES = re.compile(
    r'^sessions_rpcs_total\{code="(\w+)",method="(\w+)",reason="(\w*)",service="sessions\.v1\.SessionService"\} (\S+)$',
    re.MULTILINE,
)


def _rpcs(port: int) -> dict[tuple[str, str, str], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(method, code, reason): float(count) for code, method, reason, count in SERIES.findall(body)}


def test_a_drain_and_a_bad_request_are_counted_with_their_reasons(tmp_path: Path) -> None:
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}")
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("reasons").session()
            session.append_message(text_message("m1"))
            with pytest.raises(SessionsError) as bad:
                session.append_message("{not json")
            assert bad.value.reason == "INVALID_JSON"
            server.running.draining.active = True  # as a drain begins: new calls are refused
            try:
                with pytest.raises(SessionsError) as drained:
                    session.get_message("m1")
                assert (drained.value.code, drained.value.reason) == (grpc.StatusCode.UNAVAILABLE, "DRAINING")
            finally:
                server.running.draining.active = False
        expected = {
            ("AppendMessage", "OK", ""): 1.0,
            ("AppendMessage", "INVALID_ARGUMENT", "INVALID_JSON"): 1.0,
            ("GetMessage", "UNAVAILABLE", "DRAINING"): 1.0,
        }
        seen = [_rpcs(port)]

        def counted() -> bool:  # a refusal is counted as its handler unwinds, after its status went
            seen[0] = _rpcs(port)
            return seen[0] == expected

        assert wait_until(counted, timeout=10), seen[0]
    finally:
        server.stop()


def _row_writes_total(port: int) -> float | None:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(r"^sessions_row_writes_total (\S+)$", body, re.MULTILINE)
    return None if found is None else float(found.group(1))


def test_row_writes_are_counted_through_evictions(tmp_path: Path) -> None:
    """50 appends on 5 objects with 2 open at most: the gauge over open objects read 20 and
    dropped with each eviction; the counter reads every row written, and never goes down."""
    port = free_port()
    server = start_server(tmp_path / "data", metrics_listen=f"127.0.0.1:{port}", max_open_objects=2)
    try:
        seen: list[float] = []
        with SessionsClient(server.address) as client:
            for k in range(5):
                session = client.object(f"evicted-{k}").session()
                for i in range(10):
                    session.append_message(text_message(f"m{i}"))
                total = _row_writes_total(port)
                assert total is not None
                seen.append(total)
        assert seen == sorted(seen) and seen[0] > 0
        per_object = seen[0]
        assert seen[-1] == 5 * per_object  # every object's rows, the evicted ones' included
        assert server.running.registry.open_count <= 2
    finally:
        server.stop()
