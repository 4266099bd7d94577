"""Row budget: splitting a message's stored JSON into row-sized slices.

A stored message whose UTF-8 encoding exceeds the budget is cut greedily into slices of at most
`budget` bytes (slice 0 in the message row, the rest in continuation rows). A cut never falls
inside a code point, a code point wider than the budget gets a slice of its own, and joining the
slices gives back the input exactly.
"""

from __future__ import annotations

from sessions_server.storage.rows import utf8_length

__all__ = ["ROW_BUDGET_BYTES", "split_content", "utf8_length"]

ROW_BUDGET_BYTES = 1536 * 1024
"""Upstream's `MAX_INLINE_ROW_BYTES`: 1,572,864 bytes of stored JSON per row."""


def split_content(json_text: str, budget: int = ROW_BUDGET_BYTES) -> list[str]:
    """Split `json_text` into slices of at most `budget` UTF-8 bytes, root slice first.

    Always returns at least one slice; `""` gives `[""]`. Only a single code point wider than
    the budget can produce a slice over it.
    """
    if budget < 1:
        raise ValueError("budget must be positive")
    if len(json_text) <= budget // 4:
        return [json_text]
    ascii_only = json_text.isascii()
    if ascii_only:
        if len(json_text) <= budget:
            return [json_text]
        return [json_text[i : i + budget] for i in range(0, len(json_text), budget)]
    data = json_text.encode("utf-8", "surrogatepass")
    total = len(data)
    if total <= budget:
        return [json_text]
    slices: list[str] = []
    start = 0
    while start < total:
        end = start + budget
        if end >= total:
            end = total
        else:
            while end > start and (data[end] & 0xC0) == 0x80:
                end -= 1
            if end == start:
                # One code point wider than the budget: it gets a slice of its own.
                end = start + 1
                while end < total and (data[end] & 0xC0) == 0x80:
                    end += 1
        slices.append(data[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return slices
