"""deleteMessages splicing and clearMessages (reference notes §5, §12 "Deletes and clear")."""

from __future__ import annotations

from collections.abc import Callable

from tests.conformance.harness.messages import big_text, msg
from tests.conformance.harness.pair import Pair


def _chain(pair: Pair, ids: str, session: str = "") -> None:
    for mid in ids.split():
        pair.append(msg(mid), session=session, check=False)


def test_mid_chain_splice(pair: Pair) -> None:
    _chain(pair, "s1 s2 s3 s4")
    pair.delete(["s2"])
    pair.append(msg("s5"))


def test_prefix_delete(pair: Pair) -> None:
    _chain(pair, "p1 p2 p3 p4 p5 p6")
    pair.delete(["p1", "p2", "p3"])
    pair.delete(["p4"])  # the new root


def test_span_delete_rewires_only_boundary(pair: Pair) -> None:
    _chain(pair, "root left-1 left-2 left-leaf")
    pair.append(msg("right"), parent="root")
    pair.append(msg("right-2"))
    pair.delete(["left-1", "left-2"])
    pair.delete(["root", "left-leaf"])  # right becomes a root


def test_leaf_delete_moves_active_leaf_to_other_branch(pair: Pair) -> None:
    _chain(pair, "a b c d")
    pair.append(msg("c2"), parent="b")
    pair.append(msg("e"), parent="d")
    pair.delete(["e"])  # active leaf: max seq remaining = c2, not d
    pair.append(msg("f"))  # auto parent: the re-derived tail


def test_delete_seq_reuse_and_tail(pair: Pair) -> None:
    _chain(pair, "a b c")
    pair.delete(["c"])
    pair.append(msg("d"))  # seq reused: max(remaining)+1
    pair.delete(["a", "b", "d"])
    pair.append(msg("e"))


def test_delete_odd_arguments(pair: Pair) -> None:
    _chain(pair, "a b c")
    pair.delete([])
    pair.delete(["unknown"])
    pair.delete(["b", "b", "unknown"])
    pair.delete(["a"], session="other")  # other session: nothing
    pair.delete([""])


def test_delete_branch_point_children_go_to_nearest_survivor(pair: Pair) -> None:
    _chain(pair, "r a b")
    pair.append(msg("b2"), parent="a")
    pair.append(msg("b3"), parent="a")
    pair.append(msg("c"), parent="b2")
    pair.delete(["a", "b2"])  # b, b3 -> r; c -> r


def test_delete_everything_then_reads(pair: Pair) -> None:
    _chain(pair, "a b")
    pair.append(msg("x"), parent=None)
    pair.delete(["a", "b", "x"])
    pair.append(msg("n"))


def test_delete_large_removes_chunks(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(level="light")
    pair.append(msg("a"))
    pair.append(msg("big", big_text(3_300_000)))
    pair.append(msg("c"))
    pair.delete(["big"])


def test_clear(pair: Pair) -> None:
    _chain(pair, "a b c")
    _chain(pair, "a z", session="keep")
    pair.clear()
    pair.append(msg("d"))  # seq 1 again, a root
    pair.clear(session="empty-session")
    pair.clear()
    pair.clear()


def test_clear_large(make_pair: Callable[..., Pair]) -> None:
    pair = make_pair(level="light")
    pair.append(msg("big", big_text(1_600_000)))
    pair.clear()
    pair.append(msg("big", "small"))
