"""Hydration windows: how a path's rows are cut for reading, checked against the rule itself.

A window holds at most `max_rows` rows (the limit doubling after each window, up to `grow_to`)
and at most `max_bytes` stored bytes, except that a row larger than that stands alone; and it
is as long as those limits allow, so a long read takes few windows.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessions_server.domain.history import cut_windows, cut_windows_from_end
from sessions_server.storage.rows import PathStat


def _rows(sizes: list[int]) -> list[PathStat]:
    return [PathStat(f"m{index}", "user", size, 0) for index, size in enumerate(sizes)]


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5_000), max_size=300),
    max_rows=st.integers(min_value=1, max_value=40),
    max_bytes=st.integers(min_value=1, max_value=20_000),
    grow_to=st.integers(min_value=0, max_value=100),
)
def test_windows_are_as_long_as_the_limits_allow(sizes: list[int], max_rows: int, max_bytes: int, grow_to: int) -> None:
    rows = _rows(sizes)
    windows = cut_windows(rows, max_rows, max_bytes, grow_to=grow_to)
    assert [row for window in windows for row in window] == rows
    limit = max_rows
    taken = 0
    for window in windows:
        stored = sum(row.bytes for row in window)
        assert 1 <= len(window) <= limit
        assert len(window) == 1 or stored <= max_bytes
        taken += len(window)
        if taken < len(rows):  # a window ends only where the next row would break a limit
            following = rows[taken].bytes
            assert len(window) == limit or stored + following > max_bytes
        limit = max(limit, min(limit * 2, grow_to))


def test_first_windows_grow_and_an_oversized_row_stands_alone() -> None:
    rows = _rows([10] * 20 + [1_000] + [10] * 3)
    windows = cut_windows(rows, 2, 500, grow_to=8)
    assert [len(window) for window in windows] == [2, 4, 8, 6, 1, 3]


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5_000), max_size=300),
    max_rows=st.integers(min_value=1, max_value=40),
    max_bytes=st.integers(min_value=1, max_value=20_000),
    grow_to=st.integers(min_value=0, max_value=100),
)
def test_windows_from_the_end_are_the_windows_of_the_reversed_rows(
    sizes: list[int], max_rows: int, max_bytes: int, grow_to: int
) -> None:
    """Newest-first reads cut lazily from the end by the same rule."""
    rows = _rows(sizes)
    lazy = [list(window) for window in cut_windows_from_end(rows, max_rows, max_bytes, grow_to=grow_to)]
    assert lazy == [list(window) for window in cut_windows(rows[::-1], max_rows, max_bytes, grow_to=grow_to)]
