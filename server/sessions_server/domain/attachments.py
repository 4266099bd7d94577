"""Attachments: inline media leaves the message for a content-addressed store, and comes back.

The rule is about type, not size (reference notes §4): a record whose `url` is a base64 data URL,
or whose `data` is base64 under a declared non-text `mediaType`, is media. Its payload is
replaced in place by `attachment:sha256:<hex>`; reads put the bytes back. Walks stop below depth
8 (the parts array is depth 0). Text media is never extracted.
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessions_server.domain import jsjson
from sessions_server.domain.chunking import utf8_length

POINTER_PREFIX = "attachment:sha256:"
MAX_WALK_DEPTH = 8
DEFAULT_MEDIA_TYPE = "application/octet-stream"
MEDIA_PRECHECK_MAX_CHARS = 64 * 1024
MAX_MEDIA_TYPE_BYTES = 1024
"""Longest media type an attachment is stored under: ReadAttachment sends it beside the bytes, in
one response. A part declaring a longer one keeps its media inline, as text media does (media
type names are at most 127 characters a side, RFC 6838; parameters add a few more)."""

_POINTER_RE = re.compile(r"attachment:sha256:([0-9a-f]{64})\Z")
_BASE64_RE = re.compile(r"[A-Za-z0-9+/]*={0,2}\Z")
_WHITESPACE_RE = re.compile(r"[\t\n\f\r ]")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Payload:
    """Decoded media bytes, their address and the type they were declared with."""

    hash: str
    media_type: str
    data: bytes


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class Extraction:
    """A message with media replaced by pointers, the payloads to store (deduplicated, in
    encounter order) and every address the stored form references."""

    message: dict[str, Any]
    payloads: list[Payload]
    references: list[str]
    # How often the stored form names each reference: a read inline puts the payload back at
    # every one of them.
    uses: list[int] = dataclasses.field(default_factory=list)


def pointer_hash(value: Any) -> str | None:
    """The address in a pointer string, or None when `value` is not a pointer."""
    if not isinstance(value, str) or not value.startswith(POINTER_PREFIX):
        return None
    match = _POINTER_RE.match(value)
    return match.group(1) if match else None


def decode_base64(payload: str) -> bytes | None:
    """Decodes base64 as the browser's atob does after upstream's pre-checks; None if invalid."""
    compact = _WHITESPACE_RE.sub("", payload) if _WHITESPACE_RE.search(payload) else payload
    if len(compact) % 4 == 1 or not _BASE64_RE.match(compact):
        return None
    if len(compact) % 4 == 0:
        stripped = compact.rstrip("=")
        if len(compact) - len(stripped) > 2:
            return None
        compact = stripped
    if "=" in compact:
        return None
    try:
        return base64.b64decode(compact + "=" * (-len(compact) % 4))
    except (binascii.Error, ValueError):
        return None


def encode_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _parse_data_url(url: str) -> tuple[str, str] | None:
    if not url.startswith("data:"):
        return None
    comma = url.find(",")
    if comma < 0:
        return None
    header = url[5:comma]
    if not header.endswith(";base64"):
        return None
    return header[: -len(";base64")] or DEFAULT_MEDIA_TYPE, url[comma + 1 :]


def _inline_media(record: dict[str, Any]) -> tuple[str, str, bytes] | None:
    """(field, media type, bytes) of a record carrying inline media, else None."""
    declared = record.get("mediaType") if isinstance(record.get("mediaType"), str) else None
    url = record.get("url")
    if isinstance(url, str):
        parsed = _parse_data_url(url)
        if parsed is None:
            return None
        media_type = declared if declared is not None else parsed[0]
        if media_type.startswith("text/") or not _storable_media_type(media_type):
            return None
        data = decode_base64(parsed[1])
        return None if data is None else ("url", media_type, data)
    data_field = record.get("data")
    if declared and isinstance(data_field, str) and not declared.startswith("text/"):
        if not _storable_media_type(declared):
            return None
        data = decode_base64(data_field)
        return None if data is None else ("data", declared, data)
    return None


def _storable_media_type(media_type: str) -> bool:
    """Whether an attachment can be stored under `media_type`: not too long, text SQLite can
    hold, and one a data URL can carry. A lone surrogate (a JSON escape such as \\ud800) has no
    UTF-8 form: the media stays inline, in the message's JSON, which keeps the escape (storing it
    failed the write, INTERNAL). A comma ends a data URL's header, a `#` starts its fragment,
    and a control character is dropped from URLs by their readers: `image/png;base64,QUFB` read
    back as `data:image/png;base64,QUFB;base64,<payload>`, other bytes, for every message naming
    the payload under any type (the first type stored is every reader's)."""
    if len(media_type) > MAX_MEDIA_TYPE_BYTES // 4 and utf8_length(media_type) > MAX_MEDIA_TYPE_BYTES:
        return False
    if "," in media_type or "#" in media_type or _CONTROL_RE.search(media_type):
        return False
    if media_type.isascii():
        return True
    try:
        media_type.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_NOT_HANDLED = object()


def _rewrite(value: Any, depth: int, visit: Callable[[dict[str, Any]], Any]) -> Any:
    """Copies `value` with records rewritten by `visit` (which returns _NOT_HANDLED to descend
    into a record), down to MAX_WALK_DEPTH; returns the very same object where nothing changed."""
    if depth > MAX_WALK_DEPTH or not isinstance(value, dict | list):
        return value
    if isinstance(value, list):
        walked = [_rewrite(entry, depth + 1, visit) for entry in value]
        return walked if any(a is not b for a, b in zip(walked, value, strict=True)) else value
    replacement = visit(value)
    if replacement is not _NOT_HANDLED:
        return replacement
    changed = False
    out: dict[str, Any] = {}
    for key, entry in value.items():
        walked_entry = _rewrite(entry, depth + 1, visit)
        changed = changed or walked_entry is not entry
        out[key] = walked_entry
    return out if changed else value


def _with_parts(message: dict[str, Any], parts: Any) -> dict[str, Any]:
    if parts is message.get("parts"):
        return message
    copy = dict(message)
    copy["parts"] = parts
    return copy


def may_hold_media(json_text: str) -> bool:
    """Cheap pre-check on the JSON text a message was parsed from: False only when no record in
    it can be inline media or a pointer. Either needs a `"data` (a `data` key, a data URL) or
    the pointer prefix in the text, unless a \\u escape spells it. The check costs per
    character and the walk it saves per record, so a long text is simply walked."""
    if len(json_text) > MEDIA_PRECHECK_MAX_CHARS:
        return True
    # A one-character search runs at memchr speed, a longer one several times slower: most
    # messages hold no backslash at all.
    return '"data' in json_text or POINTER_PREFIX in json_text or ("\\" in json_text and "\\u" in json_text)


def extract(message: dict[str, Any]) -> Extraction:
    """Replaces inline media with pointers. Returns the same dict when nothing was extracted."""
    payloads: list[Payload] = []
    seen: set[str] = set()

    def visit(record: dict[str, Any]) -> Any:
        media = _inline_media(record)
        if media is None:
            return _NOT_HANDLED
        field, media_type, data = media
        digest = hashlib.sha256(data).hexdigest()
        if digest not in seen:
            seen.add(digest)
            payloads.append(Payload(digest, media_type, data))
        replaced = dict(record)
        replaced["mediaType"] = media_type
        replaced[field] = POINTER_PREFIX + digest
        return replaced

    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        return Extraction(message, [], [])
    new_parts = _rewrite(parts, 0, visit)
    uses = collections.Counter(pointers_of(new_parts))
    return Extraction(_with_parts(message, new_parts), payloads, list(uses), list(uses.values()))


def pointers_of(value: Any, depth: int = 0) -> list[str]:
    """Every address a read of this stored form restores, in walk order."""
    found: list[str] = []

    def walk(node: Any, level: int) -> None:
        if level > MAX_WALK_DEPTH or not isinstance(node, dict | list):
            return
        if isinstance(node, list):
            for entry in node:
                walk(entry, level + 1)
            return
        digest = pointer_hash(node.get("url")) or pointer_hash(node.get("data"))
        if digest is not None:
            found.append(digest)
            return
        for entry in node.values():
            walk(entry, level + 1)

    walk(value, depth)
    return found


def restored_pointers(stored_json: str) -> list[str]:
    """The hashes a read restores in a message's stored JSON, once for each place (none for
    JSON that is no message: reads skip it)."""
    if not may_hold_pointers(stored_json):
        return []
    try:
        message = jsjson.parse(stored_json)
    except jsjson.JsonInputError:
        return []
    parts = message.get("parts") if isinstance(message, dict) else None
    return pointers_of(parts) if isinstance(parts, list) else []


def resolve(message: dict[str, Any], load: Callable[[str], tuple[str, bytes] | None]) -> dict[str, Any]:
    """Puts payloads back inline; a pointer whose payload is unknown stays as it is."""
    # One payload named many times is loaded and encoded once: the restored records share the
    # string, so the message holds it once until it is written out as JSON.
    restored_forms: dict[tuple[str, str], str | None] = {}

    def restored_form(digest: str, field: str) -> str | None:
        key = (digest, field)
        if key not in restored_forms:
            loaded = load(digest)
            if loaded is None:
                restored_forms[key] = None
            else:
                encoded = encode_base64(loaded[1])
                restored_forms[key] = f"data:{loaded[0]};base64,{encoded}" if field == "url" else encoded
        return restored_forms[key]

    def visit(record: dict[str, Any]) -> Any:
        for field in ("url", "data"):
            digest = pointer_hash(record.get(field))
            if digest is None:
                continue
            form = restored_form(digest, field)
            if form is None:
                return record
            restored = dict(record)
            restored[field] = form
            return restored
        return _NOT_HANDLED

    parts = message.get("parts")
    if not isinstance(parts, list):
        return message
    return _with_parts(message, _rewrite(parts, 0, visit))


def may_hold_pointers(json_text: str) -> bool:
    """Cheap pre-check before parsing a stored row for resolution."""
    return POINTER_PREFIX in json_text
