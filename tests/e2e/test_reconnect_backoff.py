"""A client reaches a server that comes back from a long outage at once, not after gRPC's own
wait between reconnection attempts (which grows while the server is away, up to 120 s): after a
70 s outage, Python clients' calls failed for 29 s more once the server was back, longer than
the default retry policy tries (about 9 s), so every call made as the server returned failed.
The clients cap the wait (`MAX_RECONNECT_BACKOFF_MS`, 3 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_client._common import MAX_RECONNECT_BACKOFF_MS, channel_options
from sessions_client._retry import DEFAULT_RETRY_POLICY
from tests.deploy.support import Shard, free_port, text_message

pytestmark = pytest.mark.long  # about 50 s: started first (see tests/conftest.py)

# By then gRPC's uncapped wait between attempts has grown past 16 s (1 s, then x1.6 each, +-20%).
OUTAGE_SECONDS = 45.0


def test_a_call_made_as_the_server_returns_from_a_long_outage_succeeds_within_its_retries(tmp_path: Path) -> None:
    shard = Shard("server", tmp_path / "data", free_port()).start()
    try:
        with SessionsClient(shard.address) as client:
            session = client.object("k").session()
            session.append_message(text_message("before", "x"))
            shard.stop()
            # An application goes on calling while the server is away; each failure is another
            # failed connection attempt for gRPC.
            failed = 0
            probe = client.with_options(retry=None).object("k").session()
            end = time.monotonic() + OUTAGE_SECONDS
            while time.monotonic() < end:
                try:
                    probe.get_latest_leaf()
                except SessionsError:
                    failed += 1
                time.sleep(0.5)
            assert failed > 0
            shard.start()
            assert session.get_message("before") is not None  # within the default policy's attempts
    finally:
        shard.stop()


def test_the_cap_is_within_the_default_retry_window_and_the_caller_may_change_it() -> None:
    policy = DEFAULT_RETRY_POLICY
    # The policy's waits between its attempts, each at its shortest jitter (half its ceiling).
    shortest = sum(
        0.5 * min(policy.max_backoff, policy.initial_backoff * policy.multiplier ** (n - 1))
        for n in range(1, policy.max_attempts)
    )
    assert shortest > MAX_RECONNECT_BACKOFF_MS * 1.2 / 1000  # gRPC jitters its own wait by 20%
    assert dict(channel_options([], 30, 10))["grpc.max_reconnect_backoff_ms"] == MAX_RECONNECT_BACKOFF_MS
    chosen = dict(channel_options([("grpc.max_reconnect_backoff_ms", 60_000)], 30, 10))
    assert chosen["grpc.max_reconnect_backoff_ms"] == 60_000
