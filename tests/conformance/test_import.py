"""importMessage: verbatim, parent as given, created_at, duplicates (reference notes §11)."""

from __future__ import annotations

from collections.abc import Callable

from tests.conformance.harness.messages import big_text, msg, parts_msg
from tests.conformance.harness.pair import Pair

T0 = 1_600_000_000_000


def test_import_chain_and_tail(pair: Pair) -> None:
    pair.import_(msg("a"), parent=None, created_at=T0)
    pair.import_(msg("b"), parent="a", created_at=T0 + 1)
    pair.import_(msg("c"), parent="a", created_at=T0 + 2)  # branch: becomes the tail
    pair.append(msg("d"))  # under c


def test_import_missing_parent_stops_path(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.import_(msg("orphan"), parent="not-there", created_at=T0)
    pair.append(msg("child"))  # under the orphan; path stops at it
    pair.import_(msg("later"), parent="child", created_at=T0 + 5)


def test_import_duplicate_is_ignored(pair: Pair) -> None:
    pair.import_(msg("a", "first"), parent=None, created_at=T0)
    pair.import_(msg("a", "second"), parent=None, created_at=T0 + 9)
    pair.append(msg("a", "third"))
    pair.import_(msg("b"), parent="a", created_at=T0 + 10)


def test_import_created_at_values(pair: Pair) -> None:
    pair.import_(msg("zero"), parent=None, created_at=0)
    pair.import_(msg("old"), parent="zero", created_at=1)
    pair.import_(msg("future"), parent="old", created_at=4_102_444_800_000)
    pair.import_(msg("neg"), parent="future", created_at=-5)
    pair.import_(msg("past-2^53"), parent="neg", created_at=2**53 + 1)  # stored as 2^53
    pair.import_(msg("past-2^53+3"), parent="past-2^53", created_at=2**53 + 3)  # as 2^53 + 4
    pair.import_(msg("before--2^53"), parent="past-2^53+3", created_at=-(2**53) - 1)


def test_import_empty_string_parent(pair: Pair) -> None:
    """Upstream stores the parent exactly as given, "" included."""
    pair.append(msg("a"))
    pair.import_(msg("e"), parent="", created_at=T0)
    pair.append(msg("f"))


def test_import_verbatim_overlay_id_and_unsanitized(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.import_(msg("compaction_foreign", "a summary from elsewhere"), parent="a", created_at=T0)
    pair.append(msg("b"))  # under the imported overlay-like row (visible: no local record)
    pair.import_(
        parts_msg("r", [{"type": "reasoning", "text": ""}], metadata={"reserved": True}),
        parent="b",
        created_at=T0 + 1,
    )


def test_import_large_chunks(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(level="light")
    pair.import_(msg("big", big_text(3_200_000, "😀 emoji and text ")), parent=None, created_at=T0)
    pair.append(msg("after"))


def test_import_into_sessions(pair: Pair) -> None:
    pair.import_(msg("a"), parent=None, created_at=T0, session="s1")
    pair.import_(msg("a"), parent=None, created_at=T0, session="s2")
    pair.import_(msg("b"), parent="a", created_at=T0, session="s2")
