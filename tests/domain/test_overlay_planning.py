"""Overlay planning finds the spans by scanning only for the ids records name; it must choose
exactly what a walk over every position of the path chooses (upstream's rule), on random paths
and records, repeated ids (an imported cycle) and records that name no row included."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from sessions_server.domain.overlays import OverlaySpan, plan_overlays
from sessions_server.storage.rows import Compaction


def _walked(path_ids: Sequence[str], compactions: Sequence[Compaction]) -> list[OverlaySpan]:
    """Upstream's rule, position by position: the newest record starting here that ends at or
    after here (an id's last position) wins, and the walk resumes after its span."""
    last: dict[str, int] = {}
    for index, message_id in enumerate(path_ids):
        last[message_id] = index
    spans: list[OverlaySpan] = []
    i = 0
    while i < len(path_ids):
        chosen = None
        for record in compactions:
            if record.from_message_id == path_ids[i] and last.get(record.to_message_id, -1) >= i:
                chosen = record
        if chosen is None:
            i += 1
            continue
        spans.append(OverlaySpan(i, last[chosen.to_message_id], chosen))
        i = last[chosen.to_message_id] + 1
    return spans


@pytest.mark.parametrize("seed", range(40))
def test_planning_matches_the_walk_over_every_position(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"m{index}" for index in range(rng.randint(1, 60))]
    path = [rng.choice(names) for _ in range(rng.randint(0, 80))] if seed % 4 == 0 else names
    records = [
        Compaction(f"c{seq}", seq, f"summary {seq}", rng.choice([*names, "absent"]), rng.choice([*names, "gone"]), 0)
        for seq in range(rng.randint(1, 12))
    ]
    assert plan_overlays(path, records) == _walked(path, records)
