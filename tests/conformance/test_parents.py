"""Parents, branches and duplicates (reference notes §2 step 4-5, §12 "Appends and branches")."""

from __future__ import annotations

from sessions_client import AUTO
from tests.conformance.harness.messages import msg
from tests.conformance.harness.pair import Pair


def test_auto_parent_chain(pair: Pair) -> None:
    for i in range(1, 5):
        pair.append(msg(f"m{i}"))


def test_root_parent_makes_new_root_and_leaf(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.append(msg("b"))
    pair.append(msg("r2"), parent=None)
    pair.append(msg("c"))  # auto: under the new root


def test_explicit_parent_branch_becomes_active_leaf(pair: Pair) -> None:
    for mid in ("a", "b", "c", "d"):
        pair.append(msg(mid))
    pair.append(msg("b2"), parent="a")
    pair.append(msg("b3"), parent="a")
    pair.append(msg("e"), parent="d")
    pair.append(msg("f"))  # auto after an explicit-parent append


def test_unknown_and_empty_parent_become_roots(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.append(msg("x1"), parent="nope")
    pair.append(msg("x2"), parent="")
    pair.append(msg("x3"), parent="a")


def test_parent_in_other_session_is_unknown(pair: Pair) -> None:
    pair.append(msg("a"), session="s1")
    pair.append(msg("b"), session="s2", parent="a")
    pair.append(msg("a"), session="s2")  # same id in another session is a different message
    pair.append(msg("c"), session="s1")


def test_duplicate_returns_stored_row(pair: Pair) -> None:
    pair.append(msg("a", "first"))
    pair.append(msg("b", "second"))
    pair.append(msg("a", "changed text"))
    pair.append(msg("a", "changed again"), parent=None)
    pair.append(msg("b", "x"), parent="a")
    pair.append(msg("c"))  # still attaches to the tail b


def test_duplicate_in_a_batch_of_steps_keeps_seq(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.append(msg("a"))
    pair.append(msg("b"))
    pair.append(msg("b"), parent=AUTO)
    pair.append(msg("c"), parent="a")


def test_self_parent_and_odd_ids(pair: Pair) -> None:
    pair.append(msg("a"))
    pair.append(msg("self"), parent="self")  # unknown at the time: a root
    pair.append(msg("with space / slash"))
    pair.append(msg("ünïcødé-✓"))
    pair.append(msg("😀"), parent="a")
    pair.append(msg("0"))
    pair.append(msg("compaction"))  # prefix-like but not `compaction_`


def test_empty_id_message(pair: Pair) -> None:
    """A message whose id is "" (a string, so accepted). Upstream treats a falsy leaf id as "no
    leaf": once the "" row is the newest, path reads are empty and getLatestLeaf is null."""
    pair.append(msg("a"))
    pair.append(msg(""), parent=None)
    pair.append(msg("b"), parent="")


def test_many_branches_getbranches_order(pair: Pair) -> None:
    pair.append(msg("root"))
    for i in range(5):
        pair.append(msg(f"k{i}"), parent="root", check=i == 4)
    pair.append(msg("deep"), parent="k2")
