"""updateMessage / upsertMessage (reference notes §5), including continuation rows (§3)."""

from __future__ import annotations

from collections.abc import Callable

from tests.conformance.harness.messages import big_text, msg
from tests.conformance.harness.pair import Pair

BUDGET = 1_572_864


def test_update_noop_change_and_absent(pair: Pair) -> None:
    pair.append(msg("a", "one"))
    pair.append(msg("b", "two"))
    pair.update(msg("a", "one"))  # identical: no-op, prepared message returned
    pair.update(msg("a", "one changed"))
    pair.update(msg("a", "one changed", role="system"))  # role change
    pair.update(msg("zz", "absent"))  # null
    pair.update(msg("b", "two", metadata={"k": [1, 2, {"x": None}]}))
    pair.append(msg("c"))  # tail unaffected by updates


def test_update_keeps_parent_seq(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.append(msg("b"))
    pair.append(msg("c"), parent="a")
    pair.update(msg("b", "new b"))
    pair.append(msg("d"))  # still after c (the tail), not b


def test_update_isolated_per_session(pair: Pair) -> None:
    pair.append(msg("a", "s1 text"), session="s1")
    pair.append(msg("a", "s2 text"), session="s2")
    pair.update(msg("a", "s1 changed"), session="s1")
    pair.update(msg("a", "default session absent"))


def test_upsert_new_existing_and_parent_ignored(pair: Pair) -> None:
    pair.upsert(msg("a"))
    pair.upsert(msg("b"))
    pair.upsert(msg("r"), parent=None)  # new root
    pair.upsert(msg("c"), parent="a")  # new with explicit parent
    pair.upsert(msg("b", "b changed"), parent="r")  # existing: parent ignored
    pair.upsert(msg("b", "b changed"))  # unchanged
    pair.upsert(msg("x"), parent="unknown")


def test_grow_and_shrink_across_chunk_counts(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(level="light")
    pair.append(msg("small", "tiny"))
    pair.append(msg("big", big_text(5_000_000)))  # 3 continuations
    pair.update(msg("big", big_text(2_000_000)))  # 1
    pair.update(msg("big", "tiny"))  # 0
    pair.update(msg("small", big_text(3_200_000, "αβγ δ ")))  # grow a row to continuations (2-byte chars)
    pair.update(msg("small", big_text(1_600_000, "αβγ δ ")))
    pair.append(msg("after"))


def test_change_only_in_last_continuation(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(level="light")
    text = big_text(2 * BUDGET)
    pair.append(msg("m", text))
    pair.update(msg("m", text))  # identical: no-op
    pair.update(msg("m", text[:-1] + "!"))  # only the last slice differs
    pair.update(msg("m", text[:-1] + "!"))


def test_upsert_large(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(level="light")
    pair.upsert(msg("u", big_text(1_700_000)))
    pair.upsert(msg("u", big_text(1_700_001)))
    pair.upsert(msg("u", "small now"))


def test_overlay_ids_refused(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.append(msg("compaction_x"))  # refused: {inserted:false, message: input}
    pair.upsert(msg("compaction_y"), source="client")
    pair.update(msg("compaction_z"))  # null
    pair.append(msg("b"))  # attaches to the real leaf
    pair.append(msg("compaction_"))
    pair.append(msg("compactionX"))  # no underscore: a normal message


def test_update_changes_token_estimate(pair: Pair) -> None:
    pair.append(msg("a", "short"))
    pair.update(msg("a", "a much longer text " * 40))
    pair.update(msg("a", "x"))
