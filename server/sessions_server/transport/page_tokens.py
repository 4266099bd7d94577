"""Listings' page tokens: opaque to callers, checked strictly when they come back. A token names
its position and the listing it was issued for (the object, and the session for compaction
records): a token that is not of the form this server issues, or that comes back with another
object or session, is refused, never read as a position in some other listing."""

from __future__ import annotations

import base64
import hashlib

from sessions_server.domain.errors import InvalidArgument

# What a token holds, base64url-coded: a tag for its kind of listing, the listing's fingerprint,
# then the position. Session tokens are never empty, even after session "" (an empty
# next_page_token means the last page).
_SESSIONS_TAG = b"s1"
_COMPACTIONS_TAG = b"c1"
_FINGERPRINT_BYTES = 8
# Servers before listings' fingerprints issued b"s:" + a session id, and a decimal seq: a
# listing paged across an upgrade is told to start again rather than that it is another's.
_EARLIER_SESSIONS_TAG = b"s:"


def session_token(object_key: str, last_session_id: str) -> str:
    """The token of the page after the one ending with `last_session_id`."""
    # Session ids arrive as protobuf strings, valid UTF-8: none holds a lone surrogate.
    return _encode(_SESSIONS_TAG, (object_key,), last_session_id.encode("utf-8"))


def session_after(token: str, object_key: str) -> str | None:
    """The session id a ListSessions page starts after; None for the first page."""
    if not token:
        return None
    try:
        return _decode(token, _SESSIONS_TAG, (object_key,)).decode("utf-8")  # a lone surrogate is no id
    except UnicodeError:
        raise _not_issued() from None


def compaction_token(object_key: str, session_id: str, last_seq: int) -> str:
    """The token of the page after the record `last_seq`."""
    return _encode(_COMPACTIONS_TAG, (object_key, session_id), str(last_seq).encode("ascii"))


def compactions_after(token: str, object_key: str, session_id: str) -> int:
    """The record seq a ListCompactions page starts after; 0 for the first page."""
    if not token:
        return 0
    if token.isascii() and token.isdigit():
        raise _from_an_earlier_server()
    position = _decode(token, _COMPACTIONS_TAG, (object_key, session_id))
    # Issued as a record's seq, 1 on, in decimal without leading zeros: `int` would also take
    # signs, underscores and spaces, and a 0 would quietly list from the start again.
    if not (position.isdigit() and 0 < len(position) <= 18 and position[:1] != b"0"):
        raise _not_issued()
    return int(position)


def _fingerprint(listing: tuple[str, ...]) -> bytes:
    digest = hashlib.blake2b(digest_size=_FINGERPRINT_BYTES)
    for name in listing:  # each name with its length: ("ab", "c") and ("a", "bc") differ
        raw = name.encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
    return digest.digest()


def _encode(tag: bytes, listing: tuple[str, ...], position: bytes) -> str:
    return base64.urlsafe_b64encode(tag + _fingerprint(listing) + position).decode("ascii")


def _decode(token: str, tag: bytes, listing: tuple[str, ...]) -> bytes:
    """The position a token names, refused unless the token is this listing's."""
    try:
        # Strictly: the lenient decoder skips characters outside the alphabet, so a mistyped
        # token would decode to another position (`!!` to the start) instead of being refused.
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
    except (ValueError, UnicodeError):
        raise _not_issued() from None
    head = len(tag) + _FINGERPRINT_BYTES
    if tag == _SESSIONS_TAG and raw.startswith(_EARLIER_SESSIONS_TAG):
        raise _from_an_earlier_server()
    if not raw.startswith(tag) or len(raw) < head:
        raise _not_issued()
    if raw[len(tag) : head] != _fingerprint(listing):
        what = "object" if len(listing) == 1 else "object or session"
        raise InvalidArgument(
            f"page_token belongs to a listing of another {what}: pass it with the same "
            f"{' and '.join(('object_key', 'session_id')[: len(listing)])} as the call that returned it",
            field="page_token",
        )
    return raw[head:]


def _from_an_earlier_server() -> InvalidArgument:
    return InvalidArgument(
        "page_token was issued by an earlier version of this server: start the listing again (empty page_token)",
        field="page_token",
    )


def _not_issued() -> InvalidArgument:
    return InvalidArgument("page_token is not one this server issued", field="page_token")
