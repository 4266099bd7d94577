"""The path depth cap (reference notes §6): a walk from the leaf stops at depth 10,000, so a path
holds at most 10,001 rows; recent history reports `truncated` when the cap cut the path."""

from __future__ import annotations

from typing import Any

from tests.service.support import text_message

CAP_ROWS = 10_001


def test_depth_cap_at_10001_and_10002_rows(session: Any) -> None:
    for start in range(0, CAP_ROWS, 1000):  # m0 .. m10000, in batches of 1000
        session.append_messages([text_message(f"m{i}", f"t{i}") for i in range(start, min(start + 1000, CAP_ROWS))])

    history = session.get_history()
    assert len(history) == CAP_ROWS
    assert [m["id"] for m in history] == [f"m{i}" for i in range(CAP_ROWS)]
    recent = session.get_recent_history(10**12)
    assert len(recent.messages) == CAP_ROWS
    assert recent.truncated is False
    assert recent.messages[0]["id"] == "m0"
    stats = session.get_history_row_stats()
    assert len(stats) == CAP_ROWS
    assert recent.total_content_bytes == sum(s.bytes for s in stats)

    session.append_messages([text_message(f"m{CAP_ROWS}", f"t{CAP_ROWS}")])  # 10,002 rows

    history = session.get_history()
    assert len(history) == CAP_ROWS
    assert history[0]["id"] == "m1" and history[-1]["id"] == f"m{CAP_ROWS}"
    recent = session.get_recent_history(10**12)
    assert len(recent.messages) == CAP_ROWS
    assert recent.messages[0]["id"] == "m1"
    assert recent.truncated is True
    assert len(session.get_history_row_stats()) == CAP_ROWS
