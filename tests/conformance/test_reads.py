"""Reads with their options (reference notes §6). Every `Pair` step already compares the standard
read set; these scenarios add option values and shapes the standard set does not cover."""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest

from tests.conformance.harness.canon import canon
from tests.conformance.harness.messages import msg
from tests.conformance.harness.pair import Pair


def _tree(pair: Pair) -> None:
    for mid in ("a", "b", "c", "d", "e"):
        pair.append(msg(mid), check=False)
    pair.append(msg("c2"), parent="b", check=False)
    pair.append(msg("c3"), parent="b", check=False)
    pair.append(msg("d2"), parent="c2")


def test_reads_on_empty_session(pair: Pair) -> None:
    pair.check()
    pair.read("getRecentHistory", {"maxContentBytes": 0})
    pair.read("historyBatches", {"options": {"batchSize": 1}})


@pytest.mark.parametrize(
    "options",
    [
        {"batchSize": 1},
        {"batchSize": 1.5},
        {"batchSize": -3},
        {"batchSize": 4, "maxBatchBytes": 0},
        {"maxBatchBytes": 0.5},
        {"batchSize": 100, "maxBatchBytes": 200},
        {"batchSize": 2, "newestFirst": True, "leafId": "c3"},
        {"leafId": "unknown", "batchSize": 2},
        {"leafId": "", "batchSize": 3},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_history_batches_options(pair: Pair, options: dict[str, Any]) -> None:
    _tree(pair)
    pair.read("historyBatches", {"options": options})


@pytest.mark.parametrize("budget", [-1, 0, 1, 2, 10**15])
def test_recent_history_budget_values(pair: Pair, budget: int) -> None:
    _tree(pair)
    pair.read("getRecentHistory", {"maxContentBytes": budget})
    pair.read("getRecentHistory", {"maxContentBytes": budget, "options": {"leafId": "c3"}})
    pair.read("getRecentHistory", {"maxContentBytes": budget, "options": {"leafId": "a"}})


def test_history_break_after_first(pair: Pair) -> None:
    """Breaking out of the iterator: the first message forward is the root, newest-first the leaf."""
    _tree(pair)
    for options in ({}, {"newestFirst": True}, {"leafId": "c3", "newestFirst": True}, {"leafId": "c3"}):
        up = pair.oracle.call(pair.key, "", "history", {"options": options, "limit": 1})
        ours = list(
            islice(pair.ours().history(leaf_id=options.get("leafId"), newest_first=bool(options.get("newestFirst"))), 1)
        )
        assert [canon(m) for m in up] == [canon(m) for m in ours], options


def test_get_message_variants(pair: Pair) -> None:
    _tree(pair)
    for mid in ("a", "d2", "nope", "", "A"):
        pair.read("getMessage", {"id": mid})
        pair.read("getBranches", {"messageId": mid})


def test_reads_per_session(pair: Pair) -> None:
    pair.append(msg("a"), session="one")
    pair.append(msg("b"), session="one")
    pair.append(msg("a"), session="two")
    pair.append(msg("x"), session="")
    pair.read("getHistory", {"options": {"leafId": "b"}}, session="two")
    pair.read("getBranches", {"messageId": "a"}, session="two")
