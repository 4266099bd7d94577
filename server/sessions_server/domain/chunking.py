"""Row budget: splitting a message's stored JSON into row-sized slices.

A stored message whose UTF-8 encoding exceeds the budget is cut greedily into slices of at most
`budget` bytes (slice 0 in the message row, the rest in continuation rows). A cut never falls
inside a code point, a code point wider than the budget gets a slice of its own, and joining the
slices gives back the input exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import overload

from sessions_server.storage.rows import utf8_length

__all__ = ["ROW_BUDGET_BYTES", "Slices", "content_digest", "content_slices", "split_content", "utf8_length"]

ROW_BUDGET_BYTES = 1536 * 1024
"""Upstream's `MAX_INLINE_ROW_BYTES`: 1,572,864 bytes of stored JSON per row."""


def split_content(json_text: str, budget: int = ROW_BUDGET_BYTES) -> list[str]:
    """Split `json_text` into slices of at most `budget` UTF-8 bytes, root slice first.

    Always returns at least one slice; `""` gives `[""]`. Only a single code point wider than
    the budget can produce a slice over it.
    """
    return list(content_slices(json_text, budget))


class Slices(Sequence[str]):
    """A text's row slices, each cut from the text only when it is read: a message of hundreds
    of megabytes is not held a second time, as its slices, for as long as its write takes."""

    __slots__ = ("_bounds", "_text")

    def __init__(self, text: str, bounds: Sequence[int]) -> None:
        self._text = text
        self._bounds = bounds  # character offsets: each slice's start, then the text's end

    def __len__(self) -> int:
        return len(self._bounds) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("slice index out of range")
        return self._text[self._bounds[index] : self._bounds[index + 1]]

    def __iter__(self) -> Iterator[str]:
        bounds = self._bounds
        for index in range(len(bounds) - 1):
            yield self._text[bounds[index] : bounds[index + 1]]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Slices | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"Slices({len(self)} of {len(self._text)} characters)"


def content_slices(json_text: str, budget: int = ROW_BUDGET_BYTES) -> Sequence[str]:
    """`json_text` cut as `split_content` cuts it: a list of the text alone when it fits one
    row (most messages), else `Slices`."""
    if budget < 1:
        raise ValueError("budget must be positive")
    end = len(json_text)
    if end <= budget // 4:
        return [json_text]
    if json_text.isascii():
        return [json_text] if end <= budget else Slices(json_text, [*range(0, end, budget), end])
    data = json_text.encode("utf-8", "surrogatepass")
    total = len(data)
    if total <= budget:
        return [json_text]
    bounds = [0]
    start = 0
    while start < total:
        cut = start + budget
        if cut >= total:
            cut = total
        else:
            while cut > start and (data[cut] & 0xC0) == 0x80:
                cut -= 1
            if cut == start:
                # One code point wider than the budget: it gets a slice of its own.
                cut = start + 1
                while cut < total and (data[cut] & 0xC0) == 0x80:
                    cut += 1
        bounds.append(bounds[-1] + len(data[start:cut].decode("utf-8", "surrogatepass")))
        start = cut
    return Slices(json_text, bounds)


def content_digest(slices: Sequence[str]) -> str:
    """SHA-256 (hex) of the UTF-8 of the slices joined, encoded a slice at a time."""
    if len(slices) == 1:
        return hashlib.sha256(slices[0].encode("utf-8")).hexdigest()
    digest = hashlib.sha256()
    for piece in slices:
        digest.update(piece.encode("utf-8"))
    return digest.hexdigest()
