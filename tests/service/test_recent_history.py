"""GetRecentHistory (reference notes §6): the longest recent suffix of the path whose stored
bytes (continuations included) fit the budget, always at least the newest message; `truncated`
and `total_content_bytes` over the whole path. Values checked against upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.service.support import ids, stored_json, text_message, utf8_len


def test_empty_session(session: Any) -> None:
    recent = session.get_recent_history(1000)
    assert (recent.messages, recent.truncated, recent.total_content_bytes) == ([], False, 0)


def test_budget_of_one_byte_returns_only_the_leaf(session: Any) -> None:
    session.append_messages([text_message(i) for i in "abcd"])
    recent = session.get_recent_history(1)
    assert recent.messages == [text_message("d")]
    assert recent.truncated is True
    assert recent.total_content_bytes == sum(s.bytes for s in session.get_history_row_stats())


def test_zero_budget_still_returns_the_leaf(session: Any) -> None:
    session.append_messages([text_message(i) for i in "ab"])
    recent = session.get_recent_history(0)
    assert (ids(recent.messages), recent.truncated) == (["b"], True)


def test_budget_fitting_everything_is_not_truncated(session: Any) -> None:
    messages = [text_message(i, f"message {i}") for i in "abcd"]
    session.append_messages(messages)
    total = sum(s.bytes for s in session.get_history_row_stats())

    for budget in (total, total + 1, 10**12):
        recent = session.get_recent_history(budget)
        assert recent.messages == messages
        assert recent.truncated is False
        assert recent.total_content_bytes == total

    recent = session.get_recent_history(total - 1)
    assert ids(recent.messages) == ["b", "c", "d"]
    assert recent.truncated is True


def test_two_rows_plus_ten_bytes_gives_two_messages(session: Any) -> None:
    session.append_messages([text_message(f"m{i}", "equal") for i in range(5)])
    stats = session.get_history_row_stats()
    assert len({s.bytes for s in stats}) == 1
    recent = session.get_recent_history(2 * stats[0].bytes + 10)
    assert ids(recent.messages) == ["m3", "m4"]
    assert recent.truncated is True
    assert recent.total_content_bytes == 5 * stats[0].bytes


def test_continuation_bytes_count_in_the_budget(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("old", "x"))
    session.append_message(text_message("big", "b" * 2_000_000))
    session.append_message(text_message("leaf", "x"))
    stats = {s.id: s.bytes for s in session.get_history_row_stats()}
    # observed on upstream for these messages
    assert stats == {"old": 63, "big": 2_000_062, "leaf": 64}
    assert stats["big"] == utf8_len(stored_json(data_dir, object_key, "big"))
    slice0 = 1_572_864

    def window(budget: int) -> tuple[list[str], bool, int]:
        recent = session.get_recent_history(budget)
        return ids(recent.messages), recent.truncated, recent.total_content_bytes

    total = 2_000_189
    assert window(stats["leaf"] + slice0) == (["leaf"], True, total)
    assert window(stats["leaf"] + stats["big"] - 1) == (["leaf"], True, total)
    assert window(stats["leaf"] + stats["big"]) == (["big", "leaf"], True, total)
    assert window(total) == (["old", "big", "leaf"], False, total)
    assert session.get_recent_history(total).messages[1] == text_message("big", "b" * 2_000_000)


def test_recent_history_of_another_leaf(session: Any) -> None:
    session.append_messages([text_message(i) for i in "abc"])
    session.append_message(text_message("x"), parent_id="a")
    recent = session.get_recent_history(10**9, leaf_id="c")
    assert ids(recent.messages) == ["a", "b", "c"]
    assert recent.truncated is False
    assert recent.total_content_bytes == sum(s.bytes for s in session.get_history_row_stats(leaf_id="c"))
    recent = session.get_recent_history(1, leaf_id="c")
    assert (ids(recent.messages), recent.truncated) == (["c"], True)
    assert ids(session.get_recent_history(10**9).messages) == ["a", "x"]
