"""Randomized scenarios: a seeded generator of interleaved writes, run through a `Pair`.

The same seed always gives the same operations (the choices depend only on the seed and on the
stored state upstream reports, which must equal ours or the scenario already failed)."""

from __future__ import annotations

import random
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

    def run(self) -> None:
        ops = [
            (30, self.op_append),
            (5, self.op_append_duplicate),
            (10, self.op_update),
            (8, self.op_upsert),
            (8, self.op_delete),
            (2, self.op_clear),
            (7, self.op_import),
        ]
        total = sum(w for w, _ in ops)
        for _ in range(self.steps):
            session = self.rng.choice(self.sessions)
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
