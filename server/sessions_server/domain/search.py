"""Full-text search: turning a user's query into an FTS5 expression that cannot inject syntax.

Upstream quotes the whole query as one phrase, so FTS operators, column filters, `NEAR(` and `*`
are literal text and words must be adjacent and in order. The all-words mode (beyond upstream)
quotes each whitespace-separated word as its own phrase; FTS5 ANDs them, in any order.
"""

from __future__ import annotations

from sessions_server.domain.errors import InvalidArgument

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
MAX_QUERY_BYTES = 4096
PHRASE = "phrase"
ALL_WORDS = "all_words"


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def fts_expression(query: str, mode: str, *, max_query_bytes: int = MAX_QUERY_BYTES) -> str | None:
    """The MATCH expression for a query, or None when it can match nothing (empty)."""
    if "\x00" in query:
        raise InvalidArgument("query must not contain NUL characters", field="query")
    size = len(query.encode("utf-8", "surrogatepass"))
    if size > max_query_bytes:
        raise InvalidArgument(
            f"query is {size} bytes; the limit is {max_query_bytes} bytes",
            reason="LIMIT_EXCEEDED",
            field="query",
            limit="max_query_bytes",
            limit_value=str(max_query_bytes),
        )
    if mode == PHRASE:
        return _quote(query)
    words = query.split()
    if not words:
        return None
    return " ".join(_quote(word) for word in words)


def effective_limit(limit: int | None) -> int:
    """None means upstream's default of 20; 0 returns nothing (SQLite's LIMIT 0, as upstream);
    negative means no limit upstream, the cap here; larger values are capped."""
    if limit is None:
        return DEFAULT_LIMIT
    if limit < 0:
        return MAX_LIMIT
    return min(limit, MAX_LIMIT)
