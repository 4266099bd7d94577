"""Message hygiene applied before a message is stored, with JavaScript object semantics.

`sanitize_message` removes OpenAI's ephemeral provider metadata (`itemId`,
`reasoningEncryptedContent`) from every part and drops reasoning parts that carry nothing;
`strip_reserved_metadata` removes server-reserved keys from a client-sent `metadata` object.
Both reproduce upstream's object spread/rest semantics so the stored key order (and therefore
the stored bytes and `content_hash`) match upstream exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sessions_server.domain.jsjson import js_trim

__all__ = [
    "OBJECT_PROTOTYPE_KEYS",
    "js_in",
    "js_object_spread",
    "js_truthy",
    "sanitize_message",
    "strip_reserved_metadata",
]

METADATA_KEYS = ("providerMetadata", "callProviderMetadata")
OPENAI_EPHEMERAL_KEYS = ("itemId", "reasoningEncryptedContent")

OBJECT_PROTOTYPE_KEYS = frozenset(
    {
        "constructor",
        "hasOwnProperty",
        "isPrototypeOf",
        "propertyIsEnumerable",
        "toLocaleString",
        "toString",
        "valueOf",
        "__defineGetter__",
        "__defineSetter__",
        "__lookupGetter__",
        "__lookupSetter__",
        "__proto__",
    }
)
"""Names every plain JS object answers `true` to with the `in` operator (Object.prototype)."""


def js_truthy(value: Any) -> bool:
    """JS truthiness for JSON values: None, False, 0, 0.0 and "" are falsy; objects are truthy."""
    if value is None or value is False:
        return False
    if isinstance(value, str):
        return value != ""
    if isinstance(value, int | float):
        return value != 0
    return True


def js_in(key: str, obj: dict[str, Any]) -> bool:
    """JS `key in obj` for a plain object parsed from JSON (own keys plus Object.prototype)."""
    return key in obj or key in OBJECT_PROTOTYPE_KEYS


def js_object_spread(value: Any) -> dict[str, Any]:
    """JS `{...value}`: own enumerable properties of any JSON value, as a new dict.

    A string spreads into its UTF-16 code units keyed "0", "1", ...; an array into its items;
    null, booleans and numbers into nothing.
    """
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return {str(i): item for i, item in enumerate(value)}
    if isinstance(value, str):
        if value.isascii() or all(ord(ch) <= 0xFFFF for ch in value):
            return {str(i): ch for i, ch in enumerate(value)}
        units = value.encode("utf-16-le", "surrogatepass")
        return {str(i): units[2 * i : 2 * i + 2].decode("utf-16-le", "surrogatepass") for i in range(len(units) // 2)}
    return {}


def _strip_openai_metadata(part: dict[str, Any], metadata_key: str) -> dict[str, Any]:
    """Remove OpenAI's ephemeral fields from `part[metadata_key]`; the key moves to the end."""
    metadata: dict[str, Any] = part[metadata_key]
    openai = metadata.get("openai")
    if not js_truthy(openai):
        return part
    rest_openai = js_object_spread(openai)
    for key in OPENAI_EPHEMERAL_KEYS:
        rest_openai.pop(key, None)
    rest_metadata = {k: v for k, v in metadata.items() if k != "openai"}

    replacement: dict[str, Any] | None = None
    if rest_openai:
        replacement = {**rest_metadata, "openai": rest_openai}
    elif rest_metadata:
        replacement = rest_metadata

    rest = {k: v for k, v in part.items() if k != metadata_key}
    if replacement is not None:
        rest[metadata_key] = replacement
    return rest


def _keeps_reasoning(metadata: Any) -> bool:
    """JS `metadata && typeof metadata === "object" && Object.keys(metadata).length > 0`."""
    return isinstance(metadata, dict | list) and len(metadata) > 0


def sanitize_message(message: dict[str, Any]) -> dict[str, Any]:
    """Strip ephemeral OpenAI provider metadata and drop empty reasoning parts.

    Returns a new message dict (same top-level key order, `parts` replaced); the input and its
    parts are not modified.
    """
    parts: list[Any] = []
    for part in message["parts"]:
        sanitized: dict[str, Any] = part
        for key in METADATA_KEYS:
            metadata = sanitized.get(key)
            # An array never has an "openai" property, and a string is not an object.
            if isinstance(metadata, dict) and js_in("openai", metadata):
                sanitized = _strip_openai_metadata(sanitized, key)
        if sanitized.get("type") == "reasoning":
            text = sanitized.get("text")
            if (not isinstance(text, str) or js_trim(text) == "") and not _keeps_reasoning(
                sanitized.get("providerMetadata")
            ):
                continue
        parts.append(sanitized)
    return {**message, "parts": parts}


def strip_reserved_metadata(message: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """Remove server-reserved keys from a client message's `metadata` object.

    Applies only when `keys` is non-empty and `metadata` is a plain object. Returns `message`
    itself when nothing is reserved; drops the whole `metadata` field when it becomes empty.
    A key is "present" by JS `in`, so Object.prototype names count as present.
    """
    metadata = message.get("metadata")
    if not keys or not isinstance(metadata, dict):
        return message
    remaining = dict(metadata)
    changed = False
    for key in keys:
        if js_in(key, remaining):
            remaining.pop(key, None)
            changed = True
    if not changed:
        return message
    if remaining:
        return {**message, "metadata": remaining}
    return {k: v for k, v in message.items() if k != "metadata"}
