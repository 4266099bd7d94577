"""Canonical text of parsed JSON values, written the way JavaScript's `JSON.stringify` writes them.

Both sides' results are parsed by Python's `json` (dicts keep key order; ints and floats stay
distinct types) and compared as this text, so key order, number formatting and escapes all count.
Independent of the server's own `jsjson` module on purpose.
"""

from __future__ import annotations

import json
import math
import re
import time
from datetime import datetime
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def js_number(value: float) -> str:
    """ECMAScript Number::toString for a finite double (NaN/Infinity become null, as JSON does)."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    text = repr(abs(value))  # shortest round-trip digits
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    # value = 0.digits × 10^n
    lead_zeros = len(int_part + frac_part) - len((int_part + frac_part).lstrip("0"))
    n = len(int_part) + exponent - lead_zeros
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + out


def js_string(value: str) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def canon(value: Any) -> str:
    """`JSON.stringify(value)` for a value parsed from JSON."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return js_number(value)
    if isinstance(value, str):
        return js_string(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(canon(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(js_string(str(k)) + ":" + canon(v) for k, v in value.items()) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def canon_opt(value: Any) -> str | None:
    """canon() with None (JS null / Python None for "absent") kept as None."""
    return None if value is None else canon(value)


READ_TIME = "<overlay createdAt: read time>"


def _is_current_iso(value: Any, window_s: float = 86_400.0) -> bool:
    if not isinstance(value, str):
        return False
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    if stamp.tzinfo is None:
        return False
    return abs(stamp.timestamp() - time.time()) <= window_s


def canon_message(message: Any, overlay_names: dict[str, str] | None = None) -> str:
    """canon() of a read message, with a synthetic overlay's `createdAt` (set by upstream at read
    time) compared by shape (an ISO time of "now" on both sides), and overlay ids
    (`compaction_<random record id>`) renamed to a side-independent name from `overlay_names`."""
    if isinstance(message, dict) and isinstance(message.get("id"), str) and message["id"].startswith("compaction_"):
        renamed = (overlay_names or {}).get(message["id"])
        synthetic = _is_current_iso(message.get("createdAt"))
        if renamed is not None or synthetic:
            message = {
                k: (READ_TIME if k == "createdAt" and synthetic else renamed if k == "id" and renamed else v)
                for k, v in message.items()
            }
    return canon(message)


def canon_message_opt(message: Any, overlay_names: dict[str, str] | None = None) -> str | None:
    return None if message is None else canon_message(message, overlay_names)
