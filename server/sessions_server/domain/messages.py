"""Messages as the domain sees them: parsing client JSON, shape rules, and preparing rows.

A message is a JSON object with a string `id`, a string `role` and an array `parts` whose items
are objects with a string `type`. Upstream fails on anything else somewhere in its pipeline (a
TypeError, a NOT NULL violation) or, on import, silently drops it; we reject it up front with
INVALID_ARGUMENT on every write path (DESIGN.md §9).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sessions_server.domain import attachments, jsjson
from sessions_server.domain.chunking import content_digest, content_slices
from sessions_server.domain.errors import InvalidArgument
from sessions_server.domain.limits import Limits, check_size, exceeded
from sessions_server.domain.sanitize import sanitize_message, strip_reserved_metadata
from sessions_server.domain.tokens import estimate_row_tokens
from sessions_server.storage.rows import COMPACTION_PREFIX, NewRow, PayloadRow, has_message_fields, utf8_length

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Messages of more JSON than this are prepared (parsed, checked, sanitized, stamped, sliced) on a
# worker thread. Their walks are Python loops, which there hand the event loop the interpreter
# every few milliseconds instead of holding it for the whole message: a 20 MB message of two
# million parts held every call to every object for about 10 s.
PREPARE_OFF_LOOP_CHARS = 256 * 1024
# ... and so are smaller messages of many JSON values, for those walks cost per value more than
# per character: 145 arrays nested 900 deep (256 KiB) took 83 ms on the loop (plain text 0.4 ms),
# 8,000 parts 25 ms. Values are counted by their openings and separators, about a microsecond
# each at most, so a message prepared on the loop holds it some 2 ms at most.
PREPARE_OFF_LOOP_VALUES = 2_000
# One thread prepares those, in turn. The walks hold the interpreter, and each thread that wants
# it lengthens the event loop's wait for it: four writers of nested metadata took another
# tenant's p50 from 2 ms to 137 ms on the default pool's threads, to 47 ms on this one (227 ms
# on the loop). Each waits for such messages queued before it (under 256 KiB: some 100 ms each
# at most); large messages, seconds each, go to the default pool, so that a small message never
# waits for a large one.
_MANY_VALUES_PREPARER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessions-prepare")
T = TypeVar("T")

Message = dict[str, Any]


@dataclass(slots=True)  # not frozen: built per message on every write, and frozen init costs 5x
class PreparedMessage:
    """A message ready to be stored.

    `message` is the prepared form with media inline (what a write answers, as upstream), and
    `stored` the same message with media replaced by attachment pointers (what the row holds).
    """

    message: Message
    token_estimate: int
    extraction: attachments.Extraction
    stored_json: str

    @classmethod
    def of(
        cls,
        message: Message,
        token_estimate: int,
        *,
        may_hold_media: bool = True,
        plain: bool = False,
        source_text: str | None = None,
    ) -> PreparedMessage:
        """`may_hold_media` False (see attachments.may_hold_media) skips the walk for media;
        `plain`: the message is plain data (jsjson.parse_checked); `source_text`: the JSON it
        was parsed from."""
        extraction = attachments.extract(message) if may_hold_media else attachments.Extraction(message, [], [])
        plain = plain and extraction.message is message  # media pointers are new values
        stored = jsjson.stringify(extraction.message, plain=plain, like=source_text)
        return cls(message, token_estimate, extraction, stored)

    @property
    def id(self) -> str:
        return str(self.message["id"])

    @property
    def role(self) -> str:
        return str(self.message["role"])

    @property
    def json(self) -> str:
        """The prepared message as JSON, media inline."""
        if self.extraction.message is self.message:
            return self.stored_json
        return jsjson.stringify(self.message)

    def row(self, max_inline_bytes: int = 0) -> NewRow:
        """The storage row: slices of the stored JSON, digest, payloads, references, search text;
        refused at its write past `max_inline_bytes` read back with its payloads inline (0: any)."""
        extraction = self.extraction
        payloads = extraction.payloads
        slices = content_slices(self.stored_json)
        return NewRow(
            id=self.id,
            role=self.role,
            slices=slices,
            digest=content_digest(slices),
            token_estimate=self.token_estimate,
            payloads=tuple(PayloadRow(p.hash, p.media_type, p.data) for p in payloads) if payloads else (),
            references=tuple(extraction.references),
            search_text=search_text(extraction.message),
            reference_uses=tuple(extraction.uses),
            max_inline_bytes=max_inline_bytes,
            restored_pointers=attachments.restored_pointers if payloads else None,
        )


def search_text(message: Message) -> str:
    """The text upstream indexes for a message: every text part's `text`, joined by spaces."""
    texts = []
    for part in message.get("parts", ()):
        if isinstance(part, dict) and part.get("type") == "text":
            texts.append(js_string(part.get("text")))
    return " ".join(texts)


def js_string(value: Any) -> str:
    """What JavaScript's Array#join makes of a value (`text ?? ""` first)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int | float):
        return jsjson.format_number(value)
    if isinstance(value, list):
        return ",".join("" if v is None else js_string(v) for v in value)
    return "[object Object]"


@dataclass(frozen=True, slots=True)
class FieldNames:
    """Where a write's message text and parent id sit in its request, for the field an error
    names; `{}` stands for the message's index in a batch."""

    text: str = "message_json"
    parent_id: str = "parent_id"


def parse_message(text: str, *, field: str = "message_json") -> tuple[Message, bool]:
    """Parses client JSON text into a message, or raises InvalidArgument naming the field.
    Also answers whether the message is plain data (jsjson.parse_checked)."""
    message, plain, _ = parse_client_message(text, field=field)
    return message, plain


_DIGITS = "0123456789"


def is_simple_message(value: Any) -> bool:
    """Whether a value orjson parsed is a message of the common shape, which settles its checks
    and preparation at a glance: an object with string `id` and `role` whose values are strings
    but for `parts`, an array of objects whose values are strings, each with a `type` other than
    `reasoning` and neither `url` nor `data`; no key empty or starting with a digit (JavaScript
    orders array-index keys first). Such a message is plain data nested three levels deep, of the
    shape every write needs (a lone surrogate aside: orjson refuses those); sanitizing and
    stripping reserved metadata leave it as it is (no metadata object, no reasoning part), and it
    holds no media and no pointer (only a record's `url` or `data` can)."""
    if type(value) is not dict:
        return False
    parts = value.get("parts")
    if type(parts) is not list or type(value.get("id")) is not str or type(value.get("role")) is not str:
        return False
    for key, item in value.items():
        if (type(item) is not str and key != "parts") or key[:1] in _DIGITS:  # "" is in every string
            return False
    for part in parts:
        if type(part) is not dict:
            return False
        kind = part.get("type")
        if type(kind) is not str or kind == "reasoning" or "url" in part or "data" in part:
            return False
        for key, item in part.items():
            if type(item) is not str or key[:1] in _DIGITS:
                return False
    return True


def parse_client_message(text: str, *, field: str = "message_json") -> tuple[Message, bool, bool]:
    """`parse_message`, also answering whether the message is of the common shape
    (`is_simple_message`), which `prepare_for_write` takes as `simple`."""
    if not text:
        # A field left out of the request: the parser's "Expecting value at line 1 column 1"
        # sent its reader looking for a typo in JSON that was never there.
        detail = "empty: it must hold the message as a JSON object"
        raise InvalidArgument(f"{field} is {detail}", reason="INVALID_JSON", field=field, detail=detail)
    try:
        value, plain, simple = jsjson.parse_quick(text, is_simple_message)
    except jsjson.JsonInputError as exc:
        raise InvalidArgument(
            f"{field} is not valid JSON: {exc}", reason="INVALID_JSON", field=field, detail=str(exc)
        ) from None
    if not simple or not (value["id"].isascii() and value["role"].isascii()):
        check_message_shape(value, field=field)
    return value, plain, simple


def check_message_shape(value: Any, *, field: str) -> None:
    """Raises InvalidArgument unless `value` has the shape every write path needs."""

    def reject(detail: str) -> None:
        raise InvalidArgument(
            f"{field} is not a message: {detail}", reason="INVALID_MESSAGE", field=field, detail=detail
        )

    if not isinstance(value, dict):
        reject(f"expected a JSON object, got {_json_type(value)}")
    if not isinstance(value.get("id"), str):
        reject("`id` must be a string")
    if not isinstance(value.get("role"), str):
        reject("`role` must be a string")
    # Ids and roles are lifted beside the JSON as protobuf strings, which must be valid UTF-8:
    # a lone surrogate (legal in JavaScript strings, escaped in JSON) cannot travel there.
    for key in ("id", "role"):
        if not value[key].isascii() and _LONE_SURROGATE.search(value[key]):
            reject(f"`{key}` holds a lone UTF-16 surrogate, which is not valid Unicode text")
    parts = value.get("parts")
    if not isinstance(parts, list):
        reject("`parts` must be an array")
    for index, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            reject(f"`parts[{index}]` must be an object with a string `type`")
        # Upstream's token estimate reads the media type of inline file parts as a string.
        url, media_type = part.get("url"), part.get("mediaType")
        if (
            part["type"] == "file"
            and isinstance(url, str)
            and url.startswith("data:")
            and media_type is not None
            and not isinstance(media_type, str)
        ):
            reject(f"`parts[{index}].mediaType` must be a string")


def is_stored_message(text: str) -> bool:
    """Whether stored JSON parses as a message; reads skip rows that do not (as upstream)."""
    try:
        value = jsjson.parse(text)
    except jsjson.JsonInputError:
        return False
    return has_message_fields(value)


def is_overlay_id(message_id: str) -> bool:
    """Ids of compaction overlays are derived on read; writes refuse them (upstream 0.32)."""
    return message_id.startswith(COMPACTION_PREFIX)


def prepare_for_write(
    message: Message,
    *,
    from_client: bool,
    reserved_keys: Sequence[str],
    source_text: str | None = None,
    plain: bool = False,
    simple: bool = False,
) -> PreparedMessage:
    """Append, update and upsert: sanitize, strip reserved metadata for client input, stamp.
    `source_text`, the JSON the message was parsed from, lets a message with no media skip the
    walk for it, and a `plain` message stays plain (sanitizing and stripping only remove). A
    `simple` message (`is_simple_message`) is stored as it is: each of those steps would keep it."""
    if simple:
        return PreparedMessage(
            message,
            estimate_row_tokens(message),
            attachments.Extraction(message, [], []),
            jsjson.stringify(message, plain=True, like=source_text),
        )
    prepared = sanitize_message(message)
    if from_client:
        prepared = strip_reserved_metadata(prepared, reserved_keys)
    may_hold_media = source_text is None or attachments.may_hold_media(source_text)
    return PreparedMessage.of(
        prepared, estimate_row_tokens(prepared), may_hold_media=may_hold_media, plain=plain, source_text=source_text
    )


def check_stored_size(prepared: PreparedMessage, source_text: str, bound: int, limit_name: str, field: str) -> None:
    """Refuses a message whose stored JSON is larger than `bound` where it is not the text sent
    (which was measured as it came): JSON.stringify's form can be several times longer, a number
    sent as `1E20` stored as 21 digits, so an 8 MiB message from a client was stored as 35 MiB
    past its 10 MiB cap. A message that names attachments is measured at its write, with its
    payloads inline (storage's `check_inline_size`)."""
    stored = prepared.stored_json
    if stored is source_text or not bound or prepared.extraction.references:
        return
    size = utf8_length(stored)
    if size > bound:
        raise exceeded(
            f"{field} is larger than allowed as stored: {size} bytes in the form JSON.stringify writes "
            "(a number such as 1E20 takes its 21 digits); nothing was written",
            limit_name,
            bound,
            "bytes",
        )


def prepare_for_import(message: Message, *, plain: bool = False, source_text: str | None = None) -> PreparedMessage:
    """Import is verbatim: no sanitizing, no stripping, but the same stamps and extraction."""
    return PreparedMessage.of(message, estimate_row_tokens(message), plain=plain, source_text=source_text)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def check_message_sizes(message: Message, limits: Limits, field: str) -> None:
    """The id and role travel beside every frame of the message: both are bounded. The text
    names `field`, which tells which message of a batch or an import it is."""
    check_size(message["id"], limits.max_message_id_bytes, f"the message id in {field}", "max_message_id_bytes", field)
    check_size(message["role"], limits.max_role_bytes, f"the role in {field}", "max_role_bytes", field)


def check_parent_id(parent_id: str, limits: Limits, field: str) -> None:
    """A named parent is a message id, bounded as one: its change event carries it as passed."""
    check_size(parent_id, limits.max_message_id_bytes, f"the parent id ({field})", "max_message_id_bytes", field)


def _has_many_values(texts: Sequence[str]) -> bool:
    """More than PREPARE_OFF_LOOP_VALUES values, told by `{`, `[` and `,` (also where they stand
    in strings: such a message goes to a thread needlessly, for a hop of some 0.1 ms)."""
    values = 0
    for text in texts:
        values += text.count("{") + text.count("[") + text.count(",")
        if values > PREPARE_OFF_LOOP_VALUES:
            return True
    return False


async def prepared_off_loop_if_costly(texts: Sequence[str], prepare: Callable[[], T]) -> T:
    """`prepare()` for messages of this JSON: on a worker thread for more than
    PREPARE_OFF_LOOP_CHARS of it, on the many-values thread for more than
    PREPARE_OFF_LOOP_VALUES values, else here."""
    chars = sum(map(len, texts))
    if chars > PREPARE_OFF_LOOP_CHARS:
        return await asyncio.to_thread(prepare)
    # Values are fewer than characters: a lone message of a few KB is not counted at all.
    if chars > PREPARE_OFF_LOOP_VALUES and _has_many_values(texts):  # over 256 KiB at most: 0.1 ms
        return await asyncio.get_running_loop().run_in_executor(_MANY_VALUES_PREPARER, prepare)
    return prepare()
