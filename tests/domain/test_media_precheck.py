"""The text pre-check that lets appends skip the walk for inline media must never skip a message
that has media or pointers: whenever extraction finds something, the pre-check said "maybe"."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sessions_server.domain import attachments, jsjson

_PNG = base64.b64encode(b"\x89PNG not really").decode()
_POINTER = attachments.POINTER_PREFIX + "ab" * 32

values = st.sampled_from(
    [f"data:image/png;base64,{_PNG}", _PNG, _POINTER, "plain text", "data", "dáta ü", "https://x/data.png", ""]
)
keys = st.sampled_from(["url", "data", "mediaType", "text", "type", "dàta", "note"])
records: Any = st.recursive(
    st.dictionaries(keys, values, max_size=4),
    lambda inner: st.dictionaries(keys, st.one_of(values, inner, st.lists(inner, max_size=2)), max_size=3),
    max_leaves=8,
)


@given(parts=st.lists(records, max_size=4), ascii_only=st.booleans())
def test_the_precheck_never_skips_a_message_with_media_or_pointers(parts: list[Any], ascii_only: bool) -> None:
    message = {"id": "m", "role": "user", "parts": [{"type": "file", **part} for part in parts]}
    text = json.dumps(message, ensure_ascii=ascii_only)
    extraction = attachments.extract(jsjson.parse(text))
    if extraction.payloads or extraction.references:
        assert attachments.may_hold_media(text)


def test_an_escaped_data_url_is_still_looked_at() -> None:
    text = '{"id":"m","role":"user","parts":[{"type":"file","url":"d\\u0061ta:image/png;base64,' + _PNG + '"}]}'
    assert attachments.may_hold_media(text)
    assert attachments.extract(jsjson.parse(text)).payloads


def test_plain_text_skips_the_walk() -> None:
    text = json.dumps({"id": "m", "role": "user", "parts": [{"type": "text", "text": "about metadata and dates"}]})
    assert not attachments.may_hold_media(text)


def test_a_long_text_is_walked_instead() -> None:
    """Past MEDIA_PRECHECK_MAX_CHARS scanning the text costs more than the walk it would save."""
    long_text = "no media here " * (attachments.MEDIA_PRECHECK_MAX_CHARS // 10)
    text = json.dumps({"id": "m", "role": "user", "parts": [{"type": "text", "text": long_text}]})
    assert attachments.may_hold_media(text)
