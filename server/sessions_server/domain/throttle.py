"""Once a window per key: what repeats (a failing object's log line, a session told its
threshold compacts nothing) is said at most once a window, the keys remembered in bounded memory."""

from __future__ import annotations

import time
from collections.abc import Hashable


class Throttle:
    """`due(key)` is true at most once every `window` seconds per key; past `max_keys` keys
    remembered, the stale ones are forgotten (oldest first), else the older half."""

    def __init__(self, window: float, max_keys: int) -> None:
        self.window = window
        self._max_keys = max_keys
        self._last: dict[Hashable, float] = {}  # key: when it was last due, newest last

    def due(self, key: Hashable) -> bool:
        """Whether `key` is due (noted as due now when so)."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        if len(self._last) >= self._max_keys:
            stale = [known for known, when in self._last.items() if now - when >= self.window]
            for known in stale or list(self._last)[: self._max_keys // 2]:
                del self._last[known]
        self._last.pop(key, None)
        self._last[key] = now
        return True
