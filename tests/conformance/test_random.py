"""Randomized differential scenarios with fixed seeds (1-5 by default; the rich ones 1-3).

CONFORMANCE_SEEDS=1-200 CONFORMANCE_STEPS=60 tests/conformance/run.sh -k random
CONFORMANCE_RICH_SEEDS=1-100 CONFORMANCE_STEPS=40 tests/conformance/run.sh -k random_rich
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.conformance.harness.gen import Generator, RichGenerator, parse_seeds
from tests.conformance.harness.pair import Pair

pytestmark = pytest.mark.long  # about 95 s: started first (see tests/conftest.py)

SEEDS = parse_seeds(os.environ.get("CONFORMANCE_SEEDS", "1-5"))
STEPS = int(os.environ.get("CONFORMANCE_STEPS", "30"))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_scenario(make_pair: Callable[..., Pair], seed: int) -> None:
    pair = make_pair(level="normal", label=f"seed{seed}")
    Generator(seed, pair, steps=STEPS).run()
    pair.check(level="full")


RICH_SEEDS = parse_seeds(os.environ.get("CONFORMANCE_RICH_SEEDS", "1-3"))


@pytest.mark.parametrize("seed", RICH_SEEDS)
def test_random_rich_scenario(make_pair: Callable[..., Pair], seed: int) -> None:
    """Media, compaction overlays, searches and messages past one row, among the plain writes."""
    pair = make_pair(level="normal", label=f"rich{seed}")
    generator = RichGenerator(seed, pair, steps=STEPS)
    generator.run()
    pair.check(level="full")
    if generator.searched:  # the index as the writes since the last search left it
        pair.search("alpha")
