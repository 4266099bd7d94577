"""Token estimates stamped on stored rows, computed exactly as upstream does.

A string costs `ceil(max(utf16_length / 4, words * 1.3))` (IEEE doubles, JS whitespace for
words); a message costs 4 plus its text, reasoning and tool parts; a row additionally charges
every top-level inline `data:` file part (a flat 1600 for images, else bytes/4 capped at 20000).
Non-string values are estimated on their `JSON.stringify` text; null and missing values cost 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sessions_server.domain.jsjson import JS_WHITESPACE, js_word_count, stringify, utf16_length

__all__ = [
    "CHARS_PER_TOKEN",
    "IMAGE_ATTACHMENT_TOKENS",
    "MAX_ATTACHMENT_TOKENS",
    "TOKENS_PER_MESSAGE",
    "WORDS_TOKEN_MULTIPLIER",
    "estimate_attachment_tokens",
    "estimate_message_tokens",
    "estimate_row_tokens",
    "estimate_string_tokens",
    "estimate_value_tokens",
    "estimated_data_url_bytes",
]

CHARS_PER_TOKEN = 4
WORDS_TOKEN_MULTIPLIER = 1.3
TOKENS_PER_MESSAGE = 4
IMAGE_ATTACHMENT_TOKENS = 1600
MAX_ATTACHMENT_TOKENS = 20_000
DEFAULT_MEDIA_TYPE = "application/octet-stream"


_ASCII_WHITESPACE = "".join(ch for ch in JS_WHITESPACE if ch.isascii())


def estimate_string_tokens(text: str) -> int:
    """Heuristic token count of one string (0 for the empty string)."""
    if not text:
        return 0
    char_estimate = utf16_length(text) / CHARS_PER_TOKEN
    if text.isascii():
        # Words are separated by whitespace, so there is at most one word more than there are
        # whitespace characters. When even that many cannot outweigh the characters, counting
        # the words exactly is not needed. (`in` finds a character several times faster than `count` counts it.)
        most_words = 1
        for ch in _ASCII_WHITESPACE:  # a loop, not a generator: this runs for every message
            if ch in text:
                most_words += text.count(ch)
        if most_words * WORDS_TOKEN_MULTIPLIER <= char_estimate:
            return math.ceil(char_estimate)
    word_estimate = js_word_count(text) * WORDS_TOKEN_MULTIPLIER
    return math.ceil(max(char_estimate, word_estimate))


def estimate_value_tokens(value: Any) -> int:
    """Estimate any JSON value: strings directly, others on their JSON text, None as 0."""
    if value is None:
        return 0
    if isinstance(value, str):
        return estimate_string_tokens(value)
    return estimate_string_tokens(stringify(value))


def _nullish_coalesce(part: Mapping[str, Any], first: str, second: str) -> Any:
    """JS `part[first] ?? part[second]`: falls through only on null or a missing key."""
    value = part.get(first)
    return part.get(second) if value is None else value


def estimate_message_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Per message 4 tokens plus the estimate of its text, reasoning and tool parts."""
    tokens = 0
    for message in messages:
        tokens += TOKENS_PER_MESSAGE
        for part in message["parts"]:
            part_type: str = part["type"]
            if part_type in ("text", "reasoning"):
                tokens += estimate_value_tokens(_nullish_coalesce(part, "text", "reasoning"))
            elif part_type.startswith("tool-") or part_type == "dynamic-tool":
                tokens += estimate_value_tokens(part.get("input"))
                tokens += estimate_value_tokens(_nullish_coalesce(part, "output", "result"))
            elif "text" in part:
                tokens += estimate_value_tokens(part["text"])
            elif "result" in part:
                tokens += estimate_value_tokens(part["result"])
    return tokens


def estimate_attachment_tokens(media_type: str, byte_count: int) -> int:
    """Weight of one attachment: 1600 for `image/*`, else `min(ceil(bytes / 4), 20000)`."""
    if media_type.startswith("image/"):
        return IMAGE_ATTACHMENT_TOKENS
    return min(-(-byte_count // 4), MAX_ATTACHMENT_TOKENS)


def estimated_data_url_bytes(url: str) -> int:
    """Approximate decoded size of a `data:` URL from its payload length (UTF-16 units)."""
    comma = url.find(",")
    if not url.startswith("data:") or comma < 0:
        return 0
    header = url[len("data:") : comma]
    payload_length = utf16_length(url[comma + 1 :])
    if header.endswith(";base64"):
        return (payload_length * 3) // 4
    return payload_length


def estimate_row_tokens(message: Mapping[str, Any]) -> int:
    """Row stamp: the message estimate plus a charge per top-level inline `data:` file part.

    The charge uses the part's `mediaType` (default `application/octet-stream`), never the URL
    header. A non-string `mediaType` raises TypeError, as upstream's `startsWith` call does.
    """
    tokens = estimate_message_tokens([message])
    for part in message["parts"]:
        if part["type"] != "file":
            continue
        url = part.get("url")
        if isinstance(url, str) and url.startswith("data:"):
            media_type = part.get("mediaType")
            if media_type is None:
                media_type = DEFAULT_MEDIA_TYPE
            if not isinstance(media_type, str):
                raise TypeError("file part mediaType must be a string")
            tokens += estimate_attachment_tokens(media_type, estimated_data_url_bytes(url))
    return tokens
