"""JavaScript-compatible JSON text and string helpers.

Upstream stores `JSON.stringify(message)` and hashes those exact bytes, so this module reproduces
what a JavaScript engine does with JSON:

* `parse` behaves like `JSON.parse` and normalises the result so that `stringify(parse(text))`
  equals `JSON.stringify(JSON.parse(text))` byte for byte: numbers become the value a JS double
  would print as, object keys are kept in JS property order, duplicate keys keep the last value.
* `stringify` is `JSON.stringify` for plain data (dict, list, str, int, float, bool, None).
* Both go through orjson where it gives the same result (no floats, integers within JS's
  safe range, keys already in JS order: one scan of the value decides), and through the
  standard library with the JS normalisations otherwise. `parse_checked` hands that scan's answer
  on, so a value parsed and written back is scanned once.
* `utf16_length`, `JS_WHITESPACE_RE`, `js_is_whitespace`, `js_trim` and `js_word_count` give the
  JS notions of string length and whitespace (`s.length`, `\\s`, `String#trim`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import orjson

__all__ = [
    "JS_WHITESPACE",
    "JS_WHITESPACE_RE",
    "MAX_JSON_DEPTH",
    "JsonInputError",
    "format_number",
    "is_array_index",
    "js_is_whitespace",
    "js_key_order",
    "js_trim",
    "js_word_count",
    "parse",
    "stringify",
    "utf16_length",
]

MAX_JSON_DEPTH = 1000
"""Deepest nesting of arrays/objects accepted by `parse` (`[]` has depth 1)."""

_MAX_SAFE = 2**53
_MAX_ARRAY_INDEX = 4294967294
_DIGITS = "0123456789"


class JsonInputError(ValueError):
    """Text that `JSON.parse` would reject, or that nests deeper than `MAX_JSON_DEPTH`."""


# ── Whitespace ────────────────────────────────────────────────────────────────────────────────

JS_WHITESPACE = (
    "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
"""Every character matched by the JS regular expression `\\s` (WhiteSpace + LineTerminator)."""

JS_WHITESPACE_RE = re.compile("[" + re.escape(JS_WHITESPACE) + "]+")
"""One run of JS whitespace (the JS pattern `\\s+`)."""

_WS_SET = frozenset(JS_WHITESPACE)
_NON_ASCII_WS = tuple(ch for ch in JS_WHITESPACE if ord(ch) > 0x7F)
# Byte table: the ASCII JS whitespace bytes map to b" ", every other byte to b"a". Multi-byte
# characters become runs of b"a" and so never split a word.
_WORD_TABLE = bytes(0x20 if b < 0x80 and chr(b) in _WS_SET else 0x61 for b in range(256))


def js_is_whitespace(ch: str) -> bool:
    """True if the single character `ch` matches the JS `\\s` class."""
    return ch in _WS_SET


def js_trim(s: str) -> str:
    """JS `String#trim`: strip JS whitespace and line terminators from both ends."""
    return s.strip(JS_WHITESPACE)


def js_word_count(s: str) -> int:
    """Number of non-empty pieces of JS `s.split(/\\s+/)`; linear time, no per-word objects."""
    if not s:
        return 0
    if s.isascii():
        data = s.encode("ascii")
    else:
        for ch in _NON_ASCII_WS:
            if ch in s:
                s = s.replace(ch, " ")
        data = s.encode("utf-8", "surrogatepass")
    mapped = data.translate(_WORD_TABLE)
    return mapped.count(b" a") + (1 if mapped[0] == 0x61 else 0)


def utf16_length(s: str) -> int:
    """Length of `s` in UTF-16 code units (JS `s.length`): characters above U+FFFF count 2."""
    if s.isascii():
        return len(s)
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


# ── Numbers ───────────────────────────────────────────────────────────────────────────────────


def _shortest_digits(x: float) -> tuple[str, int]:
    """Shortest round-trip digits of a finite positive double and the decimal point position.

    Returns `(digits, n)` with the value equal to `0.digits × 10**n`, `digits` without leading or
    trailing zeros (the `s`/`k`/`n` of ECMAScript Number::toString).
    """
    r = repr(x)
    mantissa, _, exp_text = r.partition("e")
    exponent = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    point = len(int_part) + exponent
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    return stripped.rstrip("0"), point


def format_number(x: float | int) -> str:
    """JS `JSON.stringify` of a number: Number#toString, with non-finite values as `null`."""
    if isinstance(x, int):
        if -_MAX_SAFE < x < _MAX_SAFE:
            return str(x)
        try:
            x = float(x)
        except OverflowError:
            return "null"
    if x != x or x in (math.inf, -math.inf):
        return "null"
    if x == 0:
        return "0"
    text = repr(x)
    if "e" not in text:
        # Python writes the same shortest digits positionally where JS does (a decimal exponent
        # from -4 to 15, within JS's -6 to 20), "1.0" aside: an array of 1,536 floats (an
        # embedding) took 5.6 ms through the digits below, 1.6 ms so.
        return text[:-2] if text.endswith(".0") else text
    return _format_digits(x)


def _format_digits(x: float) -> str:
    """`format_number` of a finite non-zero double, from its shortest digits."""
    sign = "-" if x < 0 else ""
    digits, n = _shortest_digits(abs(x))
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    exp_text = ("+" if e >= 0 else "-") + str(abs(e))
    if k == 1:
        return sign + digits + "e" + exp_text
    return sign + digits[0] + "." + digits[1:] + "e" + exp_text


_INT64_MAX = 2**63 - 1


def js_integer(value: int) -> int:
    """The integer a JavaScript number holds for `value`, the nearest double, which is what
    upstream stores for an integer it was given (2^53 + 1 lands on 2^53). The double nearest the
    largest 64-bit integers is 2^63, one past them: that one is kept as the largest, as SQLite
    casts it (upstream stores it as a REAL)."""
    if -_MAX_SAFE <= value <= _MAX_SAFE:
        return value
    return min(int(float(value)), _INT64_MAX)


def _js_double(x: float) -> int | float | None:
    """Represent a parsed double so that `stringify` prints what JS prints for it.

    Integral values below 1e21 become ints with JS's decimal digits; other values stay floats.
    Infinities stay too: JSON.stringify writes them as null, but until then they are numbers
    (a token estimate counts their "null" text; `??` does not pass over them).
    """
    if x in (math.inf, -math.inf):
        return x
    if x.is_integer():
        if -_MAX_SAFE < x < _MAX_SAFE:
            return int(x)
        if abs(x) < 1e21:
            digits, n = _shortest_digits(abs(x))
            value = int(digits + "0" * (n - len(digits)))
            return -value if x < 0 else value
    return x


def _parse_int(text: str) -> int | float | None:
    if len(text) <= 15:
        return int(text)
    return _js_double(float(text))


def _parse_float(text: str) -> int | float | None:
    return _js_double(float(text))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# ── Object key order ──────────────────────────────────────────────────────────────────────────


def is_array_index(key: str) -> bool:
    """True for canonical array-index keys "0".."4294967294", which JS orders first."""
    if not key or key[0] not in _DIGITS:
        return False
    if len(key) > 10 or not (key.isascii() and key.isdigit()):
        return False
    if key[0] == "0" and len(key) > 1:
        return False
    return int(key) <= _MAX_ARRAY_INDEX


def _in_js_order(keys: Any) -> bool:
    """True if the string keys already follow JS property order (indices first, ascending)."""
    last = -1
    named_seen = False
    for key in keys:
        if key and key[0] in _DIGITS and is_array_index(key):
            index = int(key)
            if named_seen or index <= last:
                return False
            last = index
        else:
            named_seen = True
    return True


def js_key_order(d: dict[str, Any]) -> dict[str, Any]:
    """`d` with its keys in JS property order (array indices ascending, then insertion order)."""
    if _in_js_order(d):
        return d
    indices = sorted((k for k in d if is_array_index(k)), key=int)
    out = {k: d[k] for k in indices}
    for k, v in d.items():
        if k not in out:
            out[k] = v
    return out


def _object_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    return d if _in_js_order(d) else js_key_order(d)


# ── Recursion headroom ────────────────────────────────────────────────────────────────────────


def _ensure_recursion_headroom(depth: int) -> None:
    """Make sure the interpreter can recurse `depth` more levels (json's C code counts them).

    The limit is only ever raised, never lowered, so concurrent callers cannot hurt each other.
    """
    frames = 0
    frame = sys._getframe()
    while frame is not None:
        frames += 1
        frame = frame.f_back  # type: ignore[assignment]
    needed = frames + 2 * depth + 200
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)


_NON_BRACKET_RE = re.compile(r"[^\[\]{}]+")
_BRACKET_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}


def _text_depth(text: str) -> int:
    """Deepest array/object nesting in JSON text, ignoring brackets inside strings.

    Escapes are removed first (`\\\\` pairs, then `\\"`), so every remaining quote delimits a
    string and the even pieces of a split on `"` are the structural text. Exact for valid JSON;
    for invalid text it is exact up to the first error, where the parser stops anyway.
    """
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    structural = "".join(text.split('"')[::2])
    brackets = _NON_BRACKET_RE.sub("", structural)
    return max(0, max(itertools.accumulate(map(_BRACKET_DELTA.__getitem__, brackets)), default=0))


# ── parse ─────────────────────────────────────────────────────────────────────────────────────

_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_hook,
    parse_float=_parse_float,
    parse_int=_parse_int,
    parse_constant=_reject_constant,
)


def parse(text: str) -> Any:
    """Parse `text` like JS `JSON.parse`, normalised for byte-identical re-serialisation.

    Raises `JsonInputError` for anything `JSON.parse` rejects (including `NaN`/`Infinity`
    literals and a leading BOM) and for nesting deeper than `MAX_JSON_DEPTH`.
    """
    return parse_checked(text)[0]


def parse_checked(text: str) -> tuple[Any, bool]:
    """`parse`, and whether the value is plain data: no float, no integer beyond JS's safe range,
    every object's keys in JS order. `stringify(value, plain=True)` writes plain data without
    scanning it again; removing keys or items keeps data plain."""
    value, plain, _ = parse_quick(text, _no_quick_shape)
    return value, plain


def _no_quick_shape(value: Any) -> bool:
    return False


# orjson reads a string through its UTF-8 form, which CPython then keeps in the string for as
# long as it lives: for a text of other characters than ASCII, up to twice the text again, held
# through the write of a message parsed from it (and, remembered, after it). A large one is given
# to orjson as bytes, which go when the parse ends.
_ENCODE_BEFORE_PARSE_CHARS = 1 << 20


def _for_orjson(text: str) -> str | bytes:
    if len(text) < _ENCODE_BEFORE_PARSE_CHARS or text.isascii():
        return text
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: orjson refuses it either way
        return text


def parse_quick(text: str, quick: Callable[[Any], bool]) -> tuple[Any, bool, bool]:
    """`parse_checked`, with `quick` tried on orjson's value before the scan: a test that passes
    only plain data nested at most 64 levels deep (the common message's shape), which spares such
    a value the scan. Answers (value, plain, whether `quick` passed it)."""
    # orjson is strict RFC 8259 and several times faster. Its result is what the exact parse would
    # give whenever the value holds no float, no integer beyond JS's safe range and no object whose
    # keys JS would reorder; anything else, and every text it refuses (it nests 1,024 levels at
    # most), takes the exact path, which also words the errors.
    try:
        value = orjson.loads(_for_orjson(text))
    except orjson.JSONDecodeError:
        pass
    else:
        if quick(value):
            return value, True, True
        slow, depth = _needs_slow_path(value)
        if not slow:
            _check_depth(depth)
            return value, True, False
    return _parse_exact(text), False, False


def _check_depth(depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise JsonInputError(f"invalid JSON: nesting deeper than {MAX_JSON_DEPTH} levels")
    if depth > 64:
        _ensure_recursion_headroom(depth)  # for the decoder, and for whoever walks the value next


def _parse_exact(text: str) -> Any:
    """`parse` through the standard library's decoder, with every JS normalisation applied."""
    opening = text.count("[") + text.count("{")
    if opening > 64:
        _check_depth(_text_depth(text) if opening > MAX_JSON_DEPTH else opening)
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise JsonInputError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {_decode_problem(exc)}") from None
    except RecursionError:
        raise JsonInputError(f"invalid JSON: nesting deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # NaN / Infinity literals
        raise JsonInputError(f"invalid JSON: {exc}") from None


def _decode_problem(exc: json.JSONDecodeError) -> str:
    """The decoder's message, as a person reads it: some of them end in "at", which its own
    text follows with the place the error message here names first."""
    if exc.msg == "Invalid control character at" and exc.pos < len(exc.doc):
        code = ord(exc.doc[exc.pos])
        return f"a control character (U+{code:04X}) inside a string, which JSON needs escaped (\\u{code:04x})"
    for ending in (" starting at", " at"):  # "Unterminated string starting at"
        if exc.msg.endswith(ending):
            return exc.msg[: -len(ending)]
    return exc.msg


# ── stringify ─────────────────────────────────────────────────────────────────────────────────

_encode_string: Callable[[str], str] = json.encoder.encode_basestring
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """`text` with each lone UTF-16 surrogate (valid in JSON and in a JavaScript string) replaced
    by U+FFFD, as JavaScript's `toWellFormed` does: what UTF-8, and so a protobuf string, carries."""
    return text if text.isascii() else _SURROGATE_RE.sub("\ufffd", text)


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _needs_slow_path(value: Any) -> tuple[bool, int]:
    """Scan `value`: (True if json.dumps would differ from JSON.stringify, max nesting depth)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    max_depth = 0
    while stack:
        v, depth = stack.pop()
        t = type(v)
        if t is dict:
            depth += 1
            max_depth = max(max_depth, depth)
            last = -1
            named_seen = False
            for key, item in v.items():
                if type(key) is not str:
                    return True, max_depth
                if key and key[0] in _DIGITS and is_array_index(key):
                    index = int(key)
                    if named_seen or index <= last:
                        return True, max_depth
                    last = index
                else:
                    named_seen = True
                ti = type(item)
                if ti is dict or ti is list:
                    stack.append((item, depth))
                elif ti is float:
                    return True, max_depth
                elif ti is int:
                    if not -_MAX_SAFE < item < _MAX_SAFE:
                        return True, max_depth
                elif not (ti is str or ti is bool or item is None):
                    return True, max_depth
        elif t is list:
            depth += 1
            max_depth = max(max_depth, depth)
            for item in v:
                ti = type(item)
                if ti is dict or ti is list:
                    stack.append((item, depth))
                elif ti is float:
                    return True, max_depth
                elif ti is int:
                    if not -_MAX_SAFE < item < _MAX_SAFE:
                        return True, max_depth
                elif not (ti is str or ti is bool or item is None):
                    return True, max_depth
        elif t is float:
            return True, max_depth
        elif t is int:
            if not -_MAX_SAFE < v < _MAX_SAFE:
                return True, max_depth
        elif not (t is str or t is bool or v is None):
            return True, max_depth
    return False, max_depth


def _encode(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_encode_string(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int | float):
        out.append(format_number(value))
    elif isinstance(value, dict):
        normalised: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str):
                normalised[key] = item
            elif isinstance(key, int) and not isinstance(key, bool):
                normalised[str(key)] = item
            else:
                raise TypeError(f"object keys must be strings, not {type(key).__name__}")
        out.append("{")
        first = True
        for key, item in js_key_order(normalised).items():
            if not first:
                out.append(",")
            first = False
            out.append(_encode_string(key))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"value of type {type(value).__name__} is not JSON serializable")


def stringify(value: Any, *, plain: bool = False, like: str | None = None) -> str:
    """JS `JSON.stringify(value)` for plain JSON data (dict, list, str, int, float, bool, None).

    Compact, non-ASCII unescaped, lone surrogates escaped as `\\udxxx`, numbers formatted like
    JS, object keys in JS property order. `plain`: the caller knows the value is plain data (see
    `parse_checked`), so it is not scanned for what orjson would write differently. `like`: a
    text that is often the result (the JSON the value was parsed from); when it is, it is
    returned itself, and a large result is not held twice.
    """
    if plain:
        try:
            return _decoded(orjson.dumps(value), like)
        except orjson.JSONEncodeError:
            pass  # nesting past orjson's limit: the scan below sets the recursion headroom
    slow, depth = _needs_slow_path(value)
    if depth > 64:
        _ensure_recursion_headroom(depth)
    if slow:
        parts: list[str] = []
        _encode(value, parts)
        text = "".join(parts)
    else:
        try:
            # For plain data orjson writes JSON.stringify's bytes. It refuses lone surrogates and
            # nesting past 254 levels; those go through the standard library below.
            return _decoded(orjson.dumps(value), like)
        except orjson.JSONEncodeError:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _SURROGATE_RE.sub(_escape_surrogate, text)
    return like if like is not None and text == like else text


# Compared a piece at a time, so that the comparison holds no third copy of a large text.
_COMPARE_STEP = 1 << 20


def _decoded(encoded: bytes, like: str | None) -> str:
    """`encoded` as text: `like` when that is what it encodes, else a new string."""
    if like is None:
        return encoded.decode("utf-8")
    if len(encoded) <= _COMPARE_STEP:  # decoding is quicker than comparing piece by piece
        text = encoded.decode("utf-8")
        return like if text == like else text
    return like if _encodes(encoded, like) else encoded.decode("utf-8")


def _encodes(encoded: bytes, text: str) -> bool:
    """Whether `encoded` is the UTF-8 of `text`."""
    if len(encoded) < len(text) or (text.isascii() and len(encoded) != len(text)):
        return False
    offset = 0
    for start in range(0, len(text), _COMPARE_STEP):
        try:
            piece = text[start : start + _COMPARE_STEP].encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate, which orjson never writes
            return False
        if not encoded.startswith(piece, offset):
            return False
        offset += len(piece)
    return offset == len(encoded)
