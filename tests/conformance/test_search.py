"""Full-text search (reference notes §8): the lazily created FTS5 index, its maintenance, and the
phrase query. The index rows are compared too (upstream's read through the sql op)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.harness.messages import big_text, msg, parts_msg
from tests.conformance.harness.oracle import OracleError
from tests.conformance.harness.pair import Pair
from tests.conformance.harness.stored import file_has_search_index


def _fts_tables(pair: Pair) -> tuple[bool, bool]:
    up = bool(pair.oracle.sql(pair.key, "SELECT name FROM sqlite_master WHERE name = 'cf_agents_session_fts'"))
    return up, file_has_search_index(pair.our_file())


def _fts_rows(pair: Pair) -> None:
    up, ours = pair.search_index_rows()
    assert up == ours, "FTS index rows differ"


def search(pair: Pair, query: str, limit: int | None = None, session: str = "") -> list[dict[str, Any]]:
    return pair.search(query, limit, session, index=False)


def _corpus(pair: Pair) -> None:
    pair.append(msg("a", "alpha beta gamma"), check=False)
    pair.append(msg("c", "The runners were running quickly to the café"), check=False)
    pair.append(
        parts_msg(
            "d",
            [
                {"type": "reasoning", "text": "hidden reasoning alpha"},
                {"type": "tool-x", "toolCallId": "1", "output": "alpha"},
            ],
        ),
        check=False,
    )
    pair.append(msg("e", 'say "hi" to FTS operators AND OR NOT near*'), check=False)
    pair.append(msg("f", "alpha beta gamma alpha beta gamma delta"), session="other", check=False)


QUERIES = [
    "alpha",
    "alpha gamma",
    "gamma alpha",
    "beta gamma",
    "run",
    "cafe",
    "CAFÉ",
    'say "hi"',
    "AND",
    "near*",
    "",
    "  ",
    "!!!",
    "delta",
    "zzz",
]


def test_index_created_by_first_search_and_backfilled(pair: Pair) -> None:
    _corpus(pair)
    assert _fts_tables(pair) == (False, False)
    search(pair, "alpha")
    assert _fts_tables(pair) == (True, True)
    _fts_rows(pair)
    for query in QUERIES:
        search(pair, query)
    search(pair, "alpha", session="other")


EMPTY_MIDDLE_PART = parts_msg(
    "b", [{"type": "text", "text": "alpha"}, {"type": "text", "text": ""}, {"type": "text", "text": "gamma"}]
)


def test_backfill_joins_nonempty_text_parts(pair: Pair) -> None:
    """The first-search backfill (SQL) joins only non-empty text parts with single spaces:
    "alpha gamma"; the append-time path joins every text part: "alpha  gamma"."""
    pair.append(EMPTY_MIDDLE_PART)
    search(pair, "alpha")
    _fts_rows(pair)
    pair.append({**EMPTY_MIDDLE_PART, "id": "b2"})
    _fts_rows(pair)


def test_search_before_the_first_write_makes_no_index(pair: Pair) -> None:
    """Deliberate (README, "Deliberate differences"): a search of an object never written makes
    no file here, so no index, where upstream's makes its index then and keeps it from the first
    write the append-time way ("alpha  gamma"). Ours builds it at the next search, as upstream
    builds it at a first search ("alpha gamma"): a hit's text differs in whitespace."""
    assert search(pair, "alpha") == []
    assert _fts_tables(pair) == (True, False)
    pair.append(EMPTY_MIDDLE_PART)
    up = pair.up("search", {"query": "alpha"})
    ours = pair.ours().search("alpha")
    assert [(hit["id"], hit["content"]) for hit in up] == [("b", "alpha  gamma")]
    assert [(hit.id, hit.content) for hit in ours] == [("b", "alpha gamma")]


ODD_TEXTS = ["true", "false", "0", "-0", "1e21", "1.5", "null", '{"x":[1]}', '["x"]', '"x"', "[]", "{}"]


def _odd_text_message(message_id: str, text: str) -> str:
    return (
        '{"id":"'
        + message_id
        + '","role":"user","parts":[{"type":"text","text":'
        + text
        + '},{"type":"text","text":"x"}]}'
    )


def test_backfill_reads_non_string_texts_as_sqlite_does(pair: Pair) -> None:
    """The backfill reads `$.text` with SQLite's JSON functions (true as 1, 1e21 as 1.0e+21, an
    object or array as its JSON), the write path converts as JavaScript does ("true", "1e+21",
    "[object Object]", "x"): both kinds of index row, and what searches find through them."""
    for i, text in enumerate(ODD_TEXTS):
        pair.append(_odd_text_message(f"b{i}", text))
    search(pair, "x")
    _fts_rows(pair)
    for i, text in enumerate(ODD_TEXTS):
        pair.append(_odd_text_message(f"w{i}", text))
    _fts_rows(pair)
    for query in ("x", "1", "true", "0", "1.0e+21", "1e+21", "object", "a"):
        search(pair, query, limit=100)


NUL_TEXTS = [
    [{"type": "text", "text": "a\u0000x nulword"}],
    [{"type": "text", "text": "\u0000lead word"}, {"type": "text", "text": "tailword"}],
    [{"type": "text", "text": "\u0000"}],
    [{"type": "text", "text": "back\\u0000slash nulword"}],
    [{"type": "text", "text": {"o": "\u0000 nulword"}}, {"type": "text", "text": "x"}],
]


def test_backfill_keeps_text_past_a_nul_character(pair: Pair) -> None:
    """Our SQLite (3.40) ends a JSON string's SQL value at its first U+0000, upstream's does not:
    the first search's build indexed "a\u0000x nulword" as "a", and a text starting with one not
    at all. Written after the build, the same messages are indexed the write path's way."""
    for prefix in ("b", "w"):
        for i, parts in enumerate(NUL_TEXTS):
            pair.append(parts_msg(f"{prefix}{i}", parts))
        search(pair, "nulword", limit=100)
        _fts_rows(pair)
    for query in ("lead", "tailword", "x", "slash", "u0000"):
        search(pair, query, limit=100)


@pytest.mark.parametrize("limit", [1, 2, -1, 100])
def test_limit(pair: Pair, limit: int) -> None:
    _corpus(pair)
    search(pair, "alpha", limit=limit)


def test_limit_zero(pair: Pair) -> None:
    """Upstream passes LIMIT 0 to SQLite: no results."""
    _corpus(pair)
    search(pair, "alpha", limit=0)


def test_maintenance_after_creation(pair: Pair) -> None:
    _corpus(pair)
    search(pair, "alpha")
    pair.append(msg("g", "fresh alpha words"))
    pair.append(EMPTY_MIDDLE_PART)
    pair.update(msg("a", "now omega only"))
    pair.update(msg("c", "The runners were running quickly to the café"))  # unchanged text
    pair.update(parts_msg("b", [{"type": "text", "text": ""}]))  # text now empty: entry removed
    pair.import_(msg("h", "imported alpha"), parent="g", created_at=1_600_000_000_000)
    pair.delete(["e"])
    _fts_rows(pair)
    for query in ("alpha", "omega", "fresh alpha", "imported"):
        search(pair, query)
    pair.clear()
    _fts_rows(pair)
    search(pair, "alpha", session="other")


def test_continuation_rows_indexed_by_us_not_by_upstream_backfill(pair: Pair) -> None:
    """DESIGN §9 (deliberate): upstream's first-search backfill reads only slice 0, so a message
    that already had continuation rows is never indexed; ours indexes it."""
    pair.session_levels[""] = "light"
    pair.append(msg("big", big_text(1_700_000) + " needle"), check=False)
    pair.append(msg("small", "needle too"), check=False)
    up = [r["id"] for r in pair.up("search", {"query": "needle"})]
    ours = [r.id for r in pair.ours().search("needle")]
    assert up == ["small"]
    assert sorted(ours) == ["big", "small"]


def test_very_long_text_with_search_on(pair: Pair) -> None:
    """DESIGN §9 (deliberate): once the index exists upstream fails a ~2.5 MB text append with
    SQLITE_TOOBIG; ours stores and indexes it."""
    pair.append(msg("a", "seed"))
    search(pair, "seed")
    huge = msg("huge", big_text(2_500_000))
    with pytest.raises(OracleError, match=r"TOOBIG|too big"):
        pair.up("appendMessage", {"message": huge})
    assert pair.ours().append_message(huge).inserted
