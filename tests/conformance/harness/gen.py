"""Randomized scenarios: a seeded generator of interleaved writes, run through a `Pair`.

The same seed always gives the same operations (the choices depend only on the seed and on the
stored state upstream reports, which must equal ours or the scenario already failed)."""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Callable
from typing import Any

from sessions_client import AUTO
from tests.conformance.harness.pair import Pair

WORDS = [
    "alpha", "beta", "gamma", "δέλτα", "中文", "emoji😀", "naïve", "tab\there", "line\nbreak", "nbsp\u00a0x",
    "\u2028", "quote\"s", "back\\slash", "x" * 40, "", " ", "0", "1e21", "\x1c", "ß",
]  # fmt: skip
ROLES = ["user", "assistant", "system", "tool"]


def parse_seeds(spec: str) -> list[int]:
    """ "1-5" → 1..5; "3,8,13" → those; "7" → [7]."""
    seeds: list[int] = []
    for piece in spec.split(","):
        piece = piece.strip()
        if not piece:
            continue
        if "-" in piece:
            low, high = piece.split("-", 1)
            seeds.extend(range(int(low), int(high) + 1))
        else:
            seeds.append(int(piece))
    return seeds


class Generator:
    def __init__(self, seed: int, pair: Pair, steps: int = 30, sessions: tuple[str, ...] = ("", "s1")) -> None:
        self.rng = random.Random(seed)
        self.pair = pair
        self.steps = steps
        self.sessions = sessions
        self.id_pool = [f"r{i}" for i in range(24)]
        self.created = 1_600_000_000_000
        self.current_session = ""  # the session of the step under way

    # ── content ─────────────────────────────────────────────────────────────

    def text(self) -> str:
        n = self.rng.choice([1, 2, 3, 5, 8, 20])
        out = " ".join(self.rng.choice(WORDS) for _ in range(n))
        if self.rng.random() < 0.05:
            out += " filler" * self.rng.randint(500, 4000)
        return out

    def part(self) -> dict[str, Any]:
        kind = self.rng.random()
        if kind < 0.55:
            part: dict[str, Any] = {"type": "text", "text": self.text()}
        elif kind < 0.7:
            part = {"type": "reasoning", "text": self.rng.choice(["", "  ", "\u00a0", self.text()])}
        elif kind < 0.85:
            part = {
                "type": f"tool-{self.rng.choice(['search', 'calc'])}",
                "toolCallId": f"c{self.rng.randint(0, 9)}",
                "state": "output-available",
                "input": {"q": self.text(), "n": self.rng.choice([1, 2.5, -0.0, 1e21, 10**17])},
                "output": self.rng.choice([self.text(), {"rows": [1, 2, 3]}, None]),
            }
        elif kind < 0.92:
            part = {"type": "step-start"}
        else:
            part = {"type": "data-custom", "data": {"k": self.text(), "1": True, "0": None}}
        if self.rng.random() < 0.15:
            meta: dict[str, Any] = {"openai": {"itemId": "it", **({"keep": 1} if self.rng.random() < 0.5 else {})}}
            if self.rng.random() < 0.5:
                meta["other"] = {"x": 1}
            part[self.rng.choice(["providerMetadata", "callProviderMetadata"])] = meta
        return part

    def message(self, mid: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": mid,
            "role": self.rng.choice(ROLES),
            "parts": [self.part() for _ in range(self.rng.choice([0, 1, 1, 2, 3]))],
        }
        if self.rng.random() < 0.3:
            meta: dict[str, Any] = {}
            for key in ("reserved", "channel", "keep"):
                if self.rng.random() < 0.5:
                    meta[key] = self.rng.choice([1, "x", None, {"n": 1}])
            out["metadata"] = meta
        if self.rng.random() < 0.1:
            out["createdAt"] = "2025-01-01T00:00:00.000Z"
        return out

    # ── choices that depend on stored state ─────────────────────────────────

    def existing(self, session: str) -> list[str]:
        return [r["id"] for r in sorted(self.pair.up_rows.session_rows(session), key=lambda r: r["seq"])]

    def fresh_id(self, session: str) -> str:
        used = set(self.existing(session))
        free = [i for i in self.id_pool if i not in used]
        return self.rng.choice(free) if free else f"x{self.rng.randint(0, 10**6)}"

    def parent(self, session: str) -> Any:
        existing = self.existing(session)
        roll = self.rng.random()
        if roll < 0.6 or not existing:
            return AUTO
        if roll < 0.85:
            return self.rng.choice(existing)
        if roll < 0.92:
            return None
        return self.rng.choice(["unknown-parent", ""])

    def source(self) -> str | None:
        return self.rng.choice([None, None, "server", "client"])

    # ── the run ─────────────────────────────────────────────────────────────

    def ops(self) -> list[tuple[int, Callable[[str], None]]]:
        """(weight, operation on a session) to draw each step from."""
        return [
            (30, self.op_append),
            (5, self.op_append_duplicate),
            (10, self.op_update),
            (8, self.op_upsert),
            (8, self.op_delete),
            (2, self.op_clear),
            (7, self.op_import),
        ]

    def run(self) -> None:
        ops = self.ops()
        total = sum(w for w, _ in ops)
        for _ in range(self.steps):
            session = self.rng.choice(self.sessions)
            self.current_session = session
            roll = self.rng.uniform(0, total)
            for weight, op in ops:
                roll -= weight
                if roll <= 0:
                    op(session)
                    break

    def op_append(self, session: str) -> None:
        self.pair.append(
            self.message(self.fresh_id(session)), parent=self.parent(session), source=self.source(), session=session
        )

    def op_append_duplicate(self, session: str) -> None:
        existing = self.existing(session)
        if not existing:
            return self.op_append(session)
        mid = self.rng.choice(existing)
        self.pair.append(self.message(mid), parent=self.parent(session), source=self.source(), session=session)
        return None

    def op_update(self, session: str) -> None:
        existing = self.existing(session)
        mid = self.rng.choice(existing) if existing and self.rng.random() < 0.9 else self.fresh_id(session)
        self.pair.update(self.message(mid), source=self.source(), session=session)

    def op_upsert(self, session: str) -> None:
        existing = self.existing(session)
        mid = self.rng.choice(existing) if existing and self.rng.random() < 0.5 else self.fresh_id(session)
        self.pair.upsert(self.message(mid), parent=self.parent(session), source=self.source(), session=session)

    def op_delete(self, session: str) -> None:
        existing = self.existing(session)
        if not existing:
            self.pair.delete(["nothing"], session=session)
            return
        count = min(len(existing), self.rng.choice([1, 1, 2, 3]))
        ids = self.rng.sample(existing, count)
        if self.rng.random() < 0.2:
            ids.append("unknown")
        self.pair.delete(ids, session=session)

    def op_clear(self, session: str) -> None:
        self.pair.clear(session=session)

    def op_import(self, session: str) -> None:
        existing = self.existing(session)
        roll = self.rng.random()
        parent: str | None
        if roll < 0.6 and existing:
            parent = self.rng.choice(existing)
        elif roll < 0.8:
            parent = None
        else:
            parent = "missing-parent"
        mid = self.rng.choice(existing) if existing and self.rng.random() < 0.15 else self.fresh_id(session)
        self.created += self.rng.randint(1, 10_000)
        self.pair.import_(self.message(mid), parent=parent, created_at=self.created, session=session)


# Payloads for media parts: few, so that the same bytes recur (one stored record, several refs).
MEDIA_PAYLOADS = [random.Random(n).randbytes(n) for n in (3, 200, 1_500, 6_000, 90_000)]
MEDIA_TYPES = ["image/png", "image/jpeg", "application/pdf", None]
# Queries that find something (diacritics fold: "naive" finds "naïve"), and overlay text, which
# is never indexed.
SEARCHED_WORDS = ["alpha", "beta", "gamma", "naive", "filler", "δέλτα", "中文", "alpha beta", "summary"]
# Mixed widths, so that continuation rows are cut next to 2-, 3- and 4-byte characters.
LARGE_UNIT = "lorem δέλτα 中文 😀 "


class RichGenerator(Generator):
    """`Generator`'s writes plus inline media, manual and planned compaction overlays, and very
    large messages (in session "big", checked with the light read plan). A separate class, so
    that the plain generator's seeds keep their scenarios."""

    BIG = "big"

    def __init__(self, seed: int, pair: Pair, steps: int = 30) -> None:
        super().__init__(seed, pair, steps, sessions=("", "s1", self.BIG))
        pair.session_levels[self.BIG] = "light"
        self.manual_overlays: set[str] = set()  # sessions given an overlay by add_compaction
        self.large = False  # the message being built is past one row
        self.importing = False
        self.no_media = False  # the message being built gets no media parts
        self.searched = False  # the object has a search index

    def media_part(self) -> dict[str, Any]:
        data = self.rng.choice(MEDIA_PAYLOADS)
        media_type = self.rng.choice(MEDIA_TYPES)
        part: dict[str, Any] = {"type": "file"}
        if media_type is not None:
            part["mediaType"] = media_type
        url = f"data:{media_type or 'image/png'};base64,{base64.b64encode(data).decode()}"
        if self.rng.random() < 0.1:
            url = "attachment:sha256:" + hashlib.sha256(data).hexdigest()  # a caller's own pointer
        part["url"] = url
        if self.rng.random() < 0.2:  # nested in a tool's output
            return {"type": "tool-render", "toolCallId": "m", "state": "output-available", "output": {"image": part}}
        return part

    def part(self) -> dict[str, Any]:
        return self.media_part() if not self.no_media and self.rng.random() < 0.15 else super().part()

    def message(self, mid: str) -> dict[str, Any]:
        # A large message holds no media: the answer to its write can pass one response, and the
        # client then reads the message back, media as stored (a deliberate difference,
        # test_differences.py), where upstream answers with the media as given.
        self.large = self.current_session == self.BIG and not self.searched and self.rng.random() < 0.4
        # A duplicate-id import stores no payload here, where upstream's leaves an orphan one
        # (DESIGN §9; test_attachments.py).
        duplicate_import = self.importing and mid in self.existing(self.current_session)
        self.no_media = self.large or duplicate_import
        out = super().message(mid)
        if self.large:
            size = self.rng.randint(1_500_000, 3_400_000)
            text = (LARGE_UNIT * (size // len(LARGE_UNIT) + 1))[: size - self.rng.randint(0, 3)]
            out["parts"].append({"type": "text", "text": text})
        return out

    def ops(self) -> list[tuple[int, Callable[[str], None]]]:
        return [*super().ops(), (6, self.op_add_compaction), (6, self.op_compact), (3, self.op_search)]

    def op_import(self, session: str) -> None:
        self.importing = True
        try:
            super().op_import(session)
        finally:
            self.importing = False

    def op_add_compaction(self, session: str) -> None:
        existing = self.existing(session)
        pick: list[str] = existing or ["nothing"]
        start = self.rng.randrange(len(pick))
        end = min(len(pick) - 1, start + self.rng.choice([0, 1, 2, 4, 8]))
        from_id, to_id = pick[start], pick[end]
        roll = self.rng.random()
        if roll < 0.1:
            from_id, to_id = to_id, from_id  # reversed: ignored on read
        elif roll < 0.15:
            to_id = "unknown"
        self.manual_overlays.add(session)
        self.pair.add_compaction(f"summary {self.text()}", from_id, to_id, session=session)

    def op_compact(self, session: str) -> None:
        # Upstream's plan can drop a message when an older overlay sits in the protected head,
        # where ours does not (DESIGN §9, test_compaction.py): planned compaction runs only where
        # every overlay came from planned compaction.
        if session in self.manual_overlays:
            return self.op_add_compaction(session)
        existing = self.existing(session)
        leaf = self.rng.choice(existing) if existing and self.rng.random() < 0.25 else None
        # 1, not 0: upstream's 0 keeps the smallest tail, ours takes the policy's (else 20,000),
        # a documented difference that failed every seed whose session grew long enough (1006).
        self.pair.compact_reference(self.rng.choice([1, 8, 40, 200, 2_000]), leaf=leaf, session=session)
        return None

    def op_search(self, session: str) -> None:
        # Upstream's index leaves out messages past one row, and once it exists a text of a few
        # MB fails its write (DESIGN §9; test_search.py): the first search waits until no
        # message is past one row, and no large message comes after it. A search of an object
        # never written makes no index here (test_search.py): it waits for the first write.
        if self.pair.up_rows.chunks or not self.pair.our_file().exists():
            return self.op_append(session)
        self.searched = True
        query = self.rng.choice([*SEARCHED_WORDS, *SEARCHED_WORDS, *WORDS, self.text()])
        self.pair.search(query, self.rng.choice([None, None, None, 1, 3, -1]), session)
        return None
