"""Row budget: greedy byte-bounded slices that never split a code point."""

from __future__ import annotations

import hashlib
import sys

import pytest

from sessions_server.domain.chunking import (
    ROW_BUDGET_BYTES,
    Slices,
    content_digest,
    content_slices,
    split_content,
    utf8_length,
)


def reference_split(text: str, budget: int) -> list[str]:
    """Straightforward code-point walk, as the budget rule is described."""
    slices: list[str] = []
    start = 0
    used = 0
    for i, ch in enumerate(text):
        width = len(ch.encode("utf-8", "surrogatepass"))
        if used > 0 and used + width > budget:
            slices.append(text[start:i])
            start = i
            used = 0
        used += width
    slices.append(text[start:])
    return slices


def test_budget_constant() -> None:
    assert ROW_BUDGET_BYTES == 1536 * 1024 == 1_572_864


def test_empty_string_gives_one_empty_slice() -> None:
    assert split_content("") == [""]
    assert split_content("", 1) == [""]


@pytest.mark.parametrize(("extra", "slices"), [(-1, 1), (0, 1), (1, 2)])
def test_one_byte_under_at_over_budget(extra: int, slices: int) -> None:
    text = "x" * (ROW_BUDGET_BYTES + extra)
    out = split_content(text)
    assert len(out) == slices
    assert "".join(out) == text
    assert all(utf8_length(s) <= ROW_BUDGET_BYTES for s in out)


def test_five_million_ascii_chars_make_three_continuations() -> None:
    text = "a" * 5_000_000
    out = split_content(text)
    assert len(out) == 4
    assert [len(s) for s in out] == [ROW_BUDGET_BYTES] * 3 + [5_000_000 - 3 * ROW_BUDGET_BYTES]


def test_two_mib_makes_one_continuation() -> None:
    out = split_content("b" * (2 * 1024 * 1024))
    assert len(out) == 2
    assert utf8_length(out[0]) == ROW_BUDGET_BYTES


@pytest.mark.parametrize("offset", [0, 1, 2, 3, 4])
def test_emoji_at_the_cut_moves_whole(offset: int) -> None:
    text = "a" * (ROW_BUDGET_BYTES - offset) + "😀" + "tail"
    out = split_content(text)
    assert "".join(out) == text
    assert all(utf8_length(s) <= ROW_BUDGET_BYTES for s in out)
    if offset >= 4:
        assert out[0].endswith("😀")
    else:
        assert out[0] == "a" * (ROW_BUDGET_BYTES - offset)
        assert out[1].startswith("😀")


@pytest.mark.parametrize("budget", [1, 2, 3, 4, 5, 7, 10])
def test_small_budgets_match_reference(budget: int) -> None:
    text = "aé中😀b" * 7 + "😀😀" + "é"
    out = split_content(text, budget)
    assert out == reference_split(text, budget)
    assert "".join(out) == text
    for piece in out:
        assert piece != ""
        assert utf8_length(piece) <= budget or len(piece) == 1


def test_code_point_wider_than_budget_gets_its_own_slice() -> None:
    assert split_content("a😀b", 3) == ["a", "😀", "b"]
    assert split_content("😀😀", 2) == ["😀", "😀"]
    assert split_content("ab", 1) == ["a", "b"]


def test_mixed_text_matches_reference() -> None:
    text = ("héllo 世界 😀 " * 400)[:5000]
    for budget in (97, 256, 1000, 4096):
        assert split_content(text, budget) == reference_split(text, budget)


def test_utf8_length() -> None:
    assert utf8_length("") == 0
    assert utf8_length("abc") == 3
    assert utf8_length("é") == 2
    assert utf8_length("中") == 3
    assert utf8_length("😀") == 4
    assert utf8_length("\ud800") == 3


def test_a_20_mb_text_splits_within_the_budget_and_reassembles() -> None:
    # Its speed is measured by bench/ (the 5 MB message row), not asserted here.
    text = "é😀中 " * 2_000_000  # 20 MB of UTF-8
    out = split_content(text)
    assert "".join(out) == text
    assert all(utf8_length(s) <= ROW_BUDGET_BYTES for s in out)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x" * 10,
        "x" * (ROW_BUDGET_BYTES + 1),
        "a" * 5_000_000,
        "a" * (ROW_BUDGET_BYTES - 2) + "😀" + "tail" * 10,
        "é😀中 " * 400_000,
        "\ud800" * 600_000,  # lone surrogates, as split_content takes them
    ],
)
def test_content_slices_cut_as_split_content_and_digest_the_whole(text: str) -> None:
    slices = content_slices(text)
    assert list(slices) == split_content(text)
    assert [slices[i] for i in range(len(slices))] == split_content(text)
    assert slices[-1] == split_content(text)[-1]
    if "\ud800" not in text:
        assert content_digest(slices) == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_a_text_of_several_rows_is_cut_only_as_its_slices_are_read() -> None:
    text = "é😀中 " * 1_000_000
    slices = content_slices(text)
    assert isinstance(slices, Slices) and len(slices) > 1
    assert slices == split_content(text)  # equal to the list of its slices, compared piece by piece
    # Holding the slices holds the text and its cut points, not a second copy of the text.
    assert sys.getsizeof(slices) + sys.getsizeof(slices._bounds) < 4096
    assert content_slices("short") == ["short"]
