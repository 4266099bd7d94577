"""Message builders for scenarios."""

from __future__ import annotations

from typing import Any


def msg(mid: str, text: str | None = None, role: str | None = None, **extra: Any) -> dict[str, Any]:
    """A UIMessage with one text part (`text` defaults to a phrase naming the id)."""
    out: dict[str, Any] = {
        "id": mid,
        "role": role or ("user" if sum(map(ord, mid)) % 2 == 0 else "assistant"),
        "parts": [{"type": "text", "text": f"message {mid} says hello" if text is None else text}],
    }
    out.update(extra)
    return out


def parts_msg(mid: str, parts: list[dict[str, Any]], role: str = "assistant", **extra: Any) -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": parts, **extra}


def big_text(n: int, unit: str = "lorem ipsum dolor sit amet ") -> str:
    """Deterministic text of exactly n code points."""
    return (unit * (n // len(unit) + 1))[:n]
