"""Refusals by the token check are logged, at WARNING, without the token, and rate-limited: one
line a minute for each peer (its address, without the port) and reason, the next one counting
those left out. (With a server, and the access log: tests/service/test_access_log.py.)"""

from __future__ import annotations

import logging

import pytest

from sessions_server.transport.auth import REFUSAL_LOG_PEERS, REFUSAL_LOG_SECONDS, RefusalLog, peer_host


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "sessions.auth" and r.levelno == logging.WARNING]
    caplog.clear()
    return lines


def test_one_line_a_minute_for_each_peer_and_reason_then_the_count_left_out(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sessions.auth")
    clock = _Clock()
    refusals = RefusalLog(now=clock)
    unknown = "unknown bearer token"
    for port in range(40000, 40010):  # a client reconnecting: a new port each time
        refusals.note(
            f"ipv4:10.0.0.7:{port}", "SessionService/AppendMessage", "UNAUTHENTICATED", "UNAUTHENTICATED", unknown
        )
    assert _lines(caplog) == [
        "refused SessionService/AppendMessage from ipv4:10.0.0.7: UNAUTHENTICATED UNAUTHENTICATED "
        "(unknown bearer token)"
    ]
    # Another reason, and another peer, have lines of their own.
    refusals.note("ipv4:10.0.0.7:1", "SessionService/AppendMessage", "PERMISSION_DENIED", "PERMISSION_DENIED", "no")
    refusals.note("ipv6:[::1]:2", "SessionService/AppendMessage", "UNAUTHENTICATED", "UNAUTHENTICATED", unknown)
    refusals.note("ipv6:[::1]:3", "SessionService/AppendMessage", "UNAUTHENTICATED", "UNAUTHENTICATED", unknown)
    assert [line.split(":", 1)[0] for line in _lines(caplog)] == [
        "refused SessionService/AppendMessage from ipv4",
        "refused SessionService/AppendMessage from ipv6",
    ]
    clock.now += REFUSAL_LOG_SECONDS - 0.001
    refusals.note("ipv4:10.0.0.7:2", "SessionService/GetMessage", "UNAUTHENTICATED", "UNAUTHENTICATED", unknown)
    assert _lines(caplog) == []
    clock.now += 0.001
    refusals.note("ipv4:10.0.0.7:3", "SessionService/GetMessage", "UNAUTHENTICATED", "UNAUTHENTICATED", unknown)
    (line,) = _lines(caplog)
    assert line.startswith("refused SessionService/GetMessage from ipv4:10.0.0.7: UNAUTHENTICATED")
    assert line.endswith("10 more like it from this peer since its last line were not logged")
    refusals.note("ipv4:10.0.0.7:4", "SessionService/GetMessage", "UNAUTHENTICATED", "UNAUTHENTICATED", unknown)
    assert _lines(caplog) == []


def test_a_refusal_without_error_info_is_keyed_by_its_code_and_its_message_kept_to_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sessions.auth")
    refusals = RefusalLog(now=_Clock())
    refusals.note("ipv4:10.0.0.8:5", "Health/Check", "UNAUTHENTICATED", "", "line one\nline two " + "x" * 1_000)
    refusals.note("ipv4:10.0.0.8:6", "Health/Check", "UNAUTHENTICATED", "", "again")
    (line,) = _lines(caplog)
    assert "\n" not in line and "line one line two x" in line
    assert line.startswith("refused Health/Check from ipv4:10.0.0.8: UNAUTHENTICATED - (")
    assert len(line) < 300


def test_the_peers_remembered_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """A scan from many addresses cannot grow the log's memory without bound."""
    caplog.set_level(logging.WARNING, logger="sessions.auth")
    refusals = RefusalLog(now=_Clock())
    for n in range(REFUSAL_LOG_PEERS + 500):
        refusals.note(
            f"ipv6:[2001:db8::{n:x}]:1", "SessionService/GetMessage", "UNAUTHENTICATED", "UNAUTHENTICATED", ""
        )
    assert len(refusals._windows) == REFUSAL_LOG_PEERS
    assert len(_lines(caplog)) == REFUSAL_LOG_PEERS + 500


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.7:52144", "ipv4:10.0.0.7"),
        ("ipv6:[::1]:52144", "ipv6:[::1]"),
        ("ipv6:%5B::1%5D:5", "ipv6:%5B::1%5D"),
        ("unix:/run/sessions.sock", "unix:/run/sessions.sock"),
        ("", ""),
    ],
)
def test_a_peer_is_named_without_its_port(peer: str, host: str) -> None:
    assert peer_host(peer) == host
