"""Listings' page tokens: opaque to callers, checked strictly when they come back (a token not
of the form this server issues is refused, never read as another position). A token names a
position in its listing, not the listing: one of another session or object of the same kind
reads that position there."""

from __future__ import annotations

import base64

from sessions_server.domain.errors import InvalidArgument


def seq_after(token: str) -> int:
    if not token:
        return 0
    # Issued as a decimal row number: `int` would also take signs, underscores, spaces, other
    # scripts' digits and numbers past SQLite's, each a wrong page (or an internal error).
    if not (token.isascii() and token.isdigit() and len(token) <= 18):
        raise InvalidArgument("page_token is not one this server issued", field="page_token")
    return int(token)


# A page token names the last session id of its page. It is never empty, even after session ""
# (an empty next_page_token means the last page), so it carries a tag before the id.
_TOKEN_TAG = b"s:"


def session_token(session_id: str) -> str:
    # Session ids arrive as protobuf strings, valid UTF-8: none holds a lone surrogate.
    return base64.urlsafe_b64encode(_TOKEN_TAG + session_id.encode("utf-8")).decode("ascii")


def session_after(token: str) -> str | None:
    if not token:
        return None
    try:
        # Strictly: the lenient decoder skips characters outside the alphabet, so a mistyped
        # token would decode to another position (`!!` to the start) instead of being refused.
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
        if raw.startswith(_TOKEN_TAG):
            return raw[len(_TOKEN_TAG) :].decode("utf-8")  # a lone surrogate is no session id
    except (ValueError, UnicodeError):
        pass
    raise InvalidArgument("page_token is not one this server issued", field="page_token")
