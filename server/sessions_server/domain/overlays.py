"""Compaction overlays: which stored records replace which spans of a path, at read time.

Selection walks the path from the root; at each position the newest record (highest seq) that
starts there and ends at or after it on this path wins, its span is replaced by one synthetic
message, and the walk resumes after the span, so records starting inside it never apply.

Planning takes records without their summaries (`queries.compaction_spans`): a summary can take
3 MiB, and a session may hold any number of records. A read reads a summary by id as it sends
its overlay (`overlay_message_json`), so it holds at most the summaries of the overlays it is
sending, and a remembered plan (`paths`) holds none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import compress
from typing import Protocol

from sessions_server.domain import jsjson
from sessions_server.storage.rows import COMPACTION_PREFIX


class SpanRecord(Protocol):
    """What planning needs of a compaction record: its id and span (`queries.CompactionSpan`,
    which holds no summary; a whole `Compaction` has them too)."""

    @property
    def id(self) -> str: ...

    @property
    def from_message_id(self) -> str: ...

    @property
    def to_message_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class OverlaySpan:
    """Path indexes `start`..`end` (inclusive) replaced by `compaction`."""

    start: int
    end: int
    compaction: SpanRecord


def plan_overlays(path_ids: Sequence[str], compactions: Sequence[SpanRecord]) -> list[OverlaySpan]:
    """The spans that apply to a root-to-leaf path (upstream's selection rule); `compactions` in
    seq order."""
    if not compactions:
        return []
    by_start: dict[str, list[SpanRecord]] = {}
    for record in compactions:
        by_start.setdefault(record.from_message_id, []).append(record)
    ends = {record.to_message_id for record in compactions}
    # Only the positions of ids that records name matter; they are found by scans that run no
    # Python per row (a newest-first read of 50 messages planned a 10,000-row path in 3 ms).
    positions = range(len(path_ids))
    index_of: dict[str, int] = {}
    for index in compress(positions, map(ends.__contains__, path_ids)):
        index_of[path_ids[index]] = index  # a repeated id (a cycle) resolves to its last position
    spans: list[OverlaySpan] = []
    resume = 0
    for start in compress(positions, map(by_start.__contains__, path_ids)):
        if start < resume:
            continue  # inside the span taken
        chosen: SpanRecord | None = None
        for record in by_start[path_ids[start]]:
            if index_of.get(record.to_message_id, -1) >= start:
                chosen = record  # records are in seq order: the last match is the newest
        if chosen is not None:
            end = index_of[chosen.to_message_id]
            spans.append(OverlaySpan(start, end, chosen))
            resume = end + 1
    return spans


def overlay_id(compaction: SpanRecord) -> str:
    return COMPACTION_PREFIX + compaction.id


def overlay_message_json(compaction: SpanRecord, summary: str) -> str:
    """The synthetic message an overlay renders as, `summary` its record's (read by id as the
    overlay is sent); `createdAt` is the time of the read."""
    now = datetime.now(UTC)
    created = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    return jsjson.stringify(
        {
            "id": overlay_id(compaction),
            "role": "assistant",
            "parts": [{"type": "text", "text": summary}],
            "createdAt": created,
        }
    )
