"""SearchMessages (reference notes §8, DESIGN.md §9, issue 7): the FTS5 index's lifecycle (absent
until the first search, then created and backfilled, continuation rows included), its maintenance
on every write path, upstream's phrase semantics, the all-words mode, results, limits, the session
filter, and that no query (however hostile) fails with anything but a documented error.

The index rows are read straight from the object file with a separate read-only connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import ImportItem, SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_server.storage.paths import object_path
from tests.service.support import chunk_rows, open_readonly, text_message

FTS_TABLE = "cf_agents_session_fts"
MAX_LIMIT = 1000  # the server's cap on `limit` (issue 7: "the limit is capped")
MAX_QUERY_BYTES = 4096  # ServerConfig.max_query_bytes default


# ── helpers ──────────────────────────────────────────────────────────────────


def fts_exists(data_dir: Path, object_key: str) -> bool:
    with open_readonly(object_path(data_dir, object_key)) as conn:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (FTS_TABLE,)).fetchone()
    return row is not None


def fts_ddl(data_dir: Path, object_key: str) -> str:
    with open_readonly(object_path(data_dir, object_key)) as conn:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (FTS_TABLE,)).fetchone()
    assert row is not None
    return str(row[0])


def fts_rows(data_dir: Path, object_key: str) -> dict[tuple[str, str], tuple[str, str, int]]:
    """{(session_id, id): (role, content, rowid)} of every index row of the object."""
    with open_readonly(object_path(data_dir, object_key)) as conn:
        rows = conn.execute(f"SELECT session_id, id, role, content, rowid FROM {FTS_TABLE}").fetchall()
    out: dict[tuple[str, str], tuple[str, str, int]] = {}
    for row in rows:
        key = (str(row[0]), str(row[1]))
        assert key not in out, f"two index rows for {key}"
        out[key] = (str(row[2]), str(row[3]), int(row[4]))
    return out


def indexed(data_dir: Path, object_key: str) -> dict[tuple[str, str], str]:
    """{(session_id, id): content} of the index."""
    return {key: content for key, (_, content, _) in fts_rows(data_dir, object_key).items()}


def hit_ids(results: list[Any]) -> list[str]:
    return [r.id for r in results]


def parts_message(message_id: str, *parts: dict[str, Any], role: str = "user") -> dict[str, Any]:
    return {"id": message_id, "role": role, "parts": list(parts)}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def big_text(total_chars: int, marker: str) -> str:
    """Searchable filler ("w w w …") ending in `marker`, about `total_chars` long."""
    return "w " * ((total_chars - len(marker)) // 2) + marker


def same_text(actual: str, expected: str) -> bool:
    """Compares long strings without pytest diffing megabytes on failure."""
    return len(actual) == len(expected) and actual == expected


# ── lifecycle and backfill ───────────────────────────────────────────────────


def test_index_is_absent_until_the_first_search(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("m1", "alpha beta"))
    assert not fts_exists(data_dir, object_key)

    assert hit_ids(session.search("alpha")) == ["m1"]

    assert fts_exists(data_dir, object_key)
    ddl = " ".join(fts_ddl(data_dir, object_key).split())
    assert "fts5" in ddl.lower()
    assert "porter unicode61" in ddl


def test_reads_and_other_writes_do_not_create_the_index(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_messages([text_message("m1", "alpha"), text_message("m2", "beta")])
    session.update_message(text_message("m2", "gamma"))
    session.delete_messages(["m1"])
    session.get_history()
    session.import_message(text_message("i1", "delta"), parent_id=None)
    assert not fts_exists(data_dir, object_key)


def test_a_search_that_can_match_nothing_still_creates_the_index(session: Any, data_dir: Path, object_key: str) -> None:
    session.append_message(text_message("m1", "alpha"))
    assert session.search("", mode="all_words") == []
    assert fts_exists(data_dir, object_key)
    assert indexed(data_dir, object_key) == {("", "m1"): "alpha"}


def test_first_search_backfills_every_session_including_chunked_messages(
    obj: Any, data_dir: Path, object_key: str
) -> None:
    """Upstream's backfill skips messages with continuation rows (only slice 0 is parsed); ours
    indexes them. The backfill covers every session of the object."""
    main, other = obj.session(""), obj.session("other")
    large = big_text(2 * 1024 * 1024, "needleatend")
    main.append_message(text_message("small", "alpha gamma"))
    main.append_message(text_message("large", large))
    main.append_message(parts_message("multi", text("one"), text(""), text("two"), role="assistant"))
    main.append_message(parts_message("no-text", {"type": "reasoning", "text": "thinking hard"}))
    main.append_message(parts_message("empty-text", text("")))
    other.append_message(text_message("elsewhere", "alpha in another session"))
    assert [c["idx"] for c in chunk_rows(data_dir, object_key) if c["id"] == "large"], "large must be chunked"
    assert not fts_exists(data_dir, object_key)

    results = main.search("needleatend")

    assert hit_ids(results) == ["large"]
    assert same_text(results[0].content, large)
    rows = indexed(data_dir, object_key)
    assert set(rows) == {("", "small"), ("", "large"), ("", "multi"), ("other", "elsewhere")}
    assert rows[("", "small")] == "alpha gamma"
    assert same_text(rows[("", "large")], large)
    assert rows[("other", "elsewhere")] == "alpha in another session"
    assert fts_rows(data_dir, object_key)[("", "multi")][0] == "assistant"
    assert hit_ids(obj.session("other").search("another")) == ["elsewhere"]


def test_backfill_joins_non_empty_text_parts_with_single_spaces(session: Any, data_dir: Path, object_key: str) -> None:
    """Upstream's backfill (one INSERT…SELECT over `json_each`) keeps only text parts with
    non-empty text and joins them with single spaces, unlike the append path, which keeps empty
    parts (double spaces). Reference notes §8, Backfill."""
    session.append_message(parts_message("multi", text("one"), text(""), text("two"), text("three")))
    session.search("one")
    assert indexed(data_dir, object_key)[("", "multi")] == "one two three"
    assert [r.content for r in session.search("two")] == ["one two three"]
    session.append_message(parts_message("later", text("one"), text(""), text("two")))
    assert indexed(data_dir, object_key)[("", "later")] == "one  two"


def test_a_chunked_message_appended_after_the_index_exists_is_found(session: Any) -> None:
    session.append_message(text_message("m1", "alpha"))
    session.search("alpha")
    large = big_text(5 * 1024 * 1024, "needlefive")

    session.append_message(text_message("large", large))

    results = session.search("needlefive")
    assert hit_ids(results) == ["large"]
    assert same_text(results[0].content, large)


def test_twenty_megabyte_text_can_be_appended_and_updated_while_the_index_exists(
    session: Any, data_dir: Path, object_key: str
) -> None:
    """Upstream fails such writes with SQLITE_TOOBIG (~2.2 MB) once search is on."""
    session.append_message(text_message("m1", "alpha"))
    assert hit_ids(session.search("alpha")) == ["m1"]
    first = big_text(20 * 1000 * 1000, "firstmarker")
    second = big_text(20 * 1000 * 1000, "secondmarker")

    result = session.append_message(text_message("huge", first))
    assert result.inserted

    found = session.search("firstmarker")
    assert hit_ids(found) == ["huge"]
    assert same_text(found[0].content, first)

    assert session.update_message(text_message("huge", second)) is not None
    assert session.search("firstmarker") == []
    found = session.search("secondmarker")
    assert hit_ids(found) == ["huge"]
    assert same_text(found[0].content, second)
    assert same_text(indexed(data_dir, object_key)[("", "huge")], second)


# ── maintenance on every write path ──────────────────────────────────────────


@pytest.fixture
def indexed_session(session: Any) -> Any:
    """A session whose object already has the index."""
    session.append_message(text_message("seed", "seedword"))
    assert hit_ids(session.search("seedword")) == ["seed"]
    return session


def test_append_is_indexed_with_all_text_parts_joined_by_single_spaces(
    indexed_session: Any, data_dir: Path, object_key: str
) -> None:
    """Upstream's append path joins the `text ?? ""` of every text part with " ", so an empty part
    leaves a double space; reasoning, tool payloads and files are never indexed."""
    indexed_session.append_message(
        parts_message(
            "m1",
            text("alpha"),
            text(""),
            {"type": "reasoning", "text": "secretreasoning"},
            {
                "type": "tool-search",
                "toolCallId": "t1",
                "state": "output-available",
                "input": {"q": "secrettool"},
                "output": {"answer": "secretoutput"},
            },
            {"type": "file", "mediaType": "text/plain", "url": "data:text/plain,secretfile"},
            text("gamma"),
            role="assistant",
        )
    )

    assert indexed(data_dir, object_key)[("", "m1")] == "alpha  gamma"
    results = indexed_session.search("alpha")
    assert [(r.id, r.role, r.content, r.session_id) for r in results] == [("m1", "assistant", "alpha  gamma", "")]
    for hidden_word in ("secretreasoning", "secrettool", "secretoutput", "secretfile"):
        assert indexed_session.search(hidden_word) == [], hidden_word


def test_append_without_text_writes_no_index_row(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    indexed_session.append_message(parts_message("m1", text("")))
    indexed_session.append_message(parts_message("m2", {"type": "reasoning", "text": "hmm"}))
    assert set(indexed(data_dir, object_key)) == {("", "seed")}


def test_batch_append_and_upsert_are_indexed(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    indexed_session.append_messages([text_message("b1", "batchone"), text_message("b2", "batchtwo")])
    indexed_session.upsert_message(text_message("u1", "upsertnew"))
    assert hit_ids(indexed_session.search("batchone")) == ["b1"]
    assert hit_ids(indexed_session.search("batchtwo")) == ["b2"]
    assert hit_ids(indexed_session.search("upsertnew")) == ["u1"]

    indexed_session.upsert_message(text_message("u1", "upsertchanged"))
    assert indexed_session.search("upsertnew") == []
    assert hit_ids(indexed_session.search("upsertchanged")) == ["u1"]
    assert indexed(data_dir, object_key)[("", "u1")] == "upsertchanged"


def test_a_batch_meeting_a_stored_id_indexes_each_new_message_once(
    indexed_session: Any, data_dir: Path, object_key: str
) -> None:
    before = indexed_session.object.get_object_stats().row_writes
    batch = [text_message("n1", "newone"), text_message("seed", "replaced"), text_message("n2", "newtwo")]
    assert [r.inserted for r in indexed_session.append_messages(batch)] == [True, False, True]

    assert indexed(data_dir, object_key) == {("", "seed"): "seedword", ("", "n1"): "newone", ("", "n2"): "newtwo"}
    assert hit_ids(indexed_session.search("newone")) == ["n1"]
    assert indexed_session.search("replaced") == []
    # each new message: its row and its index row
    assert indexed_session.object.get_object_stats().row_writes - before == 4


def test_duplicate_append_keeps_the_first_text(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    indexed_session.append_message(text_message("m1", "original"))
    assert not indexed_session.append_message(text_message("m1", "replacement")).inserted
    assert hit_ids(indexed_session.search("original")) == ["m1"]
    assert indexed_session.search("replacement") == []
    assert indexed(data_dir, object_key)[("", "m1")] == "original"


def test_update_with_changed_text_replaces_the_entry(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    indexed_session.append_message(text_message("m1", "before"))
    indexed_session.update_message(text_message("m1", "after"))
    assert indexed_session.search("before") == []
    assert hit_ids(indexed_session.search("after")) == ["m1"]
    assert indexed(data_dir, object_key)[("", "m1")] == "after"


def test_update_with_unchanged_text_writes_nothing_to_the_index(
    indexed_session: Any, obj: Any, data_dir: Path, object_key: str
) -> None:
    """Upstream compares with the stored FTS content: equal text leaves the row alone (same
    rowid; only the message row is written: 1 billed row), changed text costs delete + insert
    on top of the message row (3, reference notes §12 'With FTS: update 3')."""
    indexed_session.append_message(text_message("m1", "steady"))
    rowid = fts_rows(data_dir, object_key)[("", "m1")][2]
    writes = obj.get_object_stats().row_writes

    indexed_session.update_message(text_message("m1", "steady", metadata={"note": "changed"}))

    assert obj.get_object_stats().row_writes - writes == 1
    assert fts_rows(data_dir, object_key)[("", "m1")] == ("user", "steady", rowid)

    writes = obj.get_object_stats().row_writes
    indexed_session.update_message(text_message("m1", "moved"))
    assert obj.get_object_stats().row_writes - writes == 3


def test_update_that_removes_all_text_removes_the_entry(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    indexed_session.append_message(text_message("m1", "vanishing"))
    indexed_session.update_message(parts_message("m1", {"type": "reasoning", "text": "vanishing"}))
    assert indexed_session.search("vanishing") == []
    assert ("", "m1") not in indexed(data_dir, object_key)


def test_update_that_adds_text_to_an_unindexed_message_indexes_it(
    indexed_session: Any, data_dir: Path, object_key: str
) -> None:
    indexed_session.append_message(parts_message("m1", text("")))
    indexed_session.update_message(text_message("m1", "appeared"))
    assert hit_ids(indexed_session.search("appeared")) == ["m1"]


def test_update_from_small_to_chunked_and_back(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    indexed_session.append_message(text_message("m1", "smallword"))
    large = big_text(3 * 1024 * 1024, "largeword")
    indexed_session.update_message(text_message("m1", large))
    assert indexed_session.search("smallword") == []
    assert hit_ids(indexed_session.search("largeword")) == ["m1"]
    indexed_session.update_message(text_message("m1", "tinyword"))
    assert indexed_session.search("largeword") == []
    assert indexed(data_dir, object_key)[("", "m1")] == "tinyword"


def test_delete_removes_the_entries(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    indexed_session.append_messages([text_message("m1", "doomed one"), text_message("m2", "doomed two")])
    indexed_session.append_message(text_message("m3", "doomed three"))
    assert sorted(hit_ids(indexed_session.search("doomed"))) == ["m1", "m2", "m3"]

    indexed_session.delete_messages(["m1", "m3"])

    assert hit_ids(indexed_session.search("doomed")) == ["m2"]
    assert set(indexed(data_dir, object_key)) == {("", "seed"), ("", "m2")}


def test_clear_removes_only_that_sessions_entries(obj: Any, data_dir: Path, object_key: str) -> None:
    a, b = obj.session("a"), obj.session("b")
    a.append_messages([text_message("a1", "shared word"), text_message("a2", "shared again")])
    b.append_message(text_message("b1", "shared too"))
    assert len(a.search("shared", all_sessions=True)) == 3

    a.clear_messages()

    assert a.search("shared") == []
    assert [(r.session_id, r.id) for r in a.search("shared", all_sessions=True)] == [("b", "b1")]
    assert set(indexed(data_dir, object_key)) == {("b", "b1")}


def test_import_is_indexed_and_a_duplicate_import_changes_nothing(
    indexed_session: Any, data_dir: Path, object_key: str
) -> None:
    result = indexed_session.import_messages(
        [
            ImportItem(parts_message("i1", text("imported"), text(""), text("words")), None),
            ImportItem(text_message("i2", "another arrival"), "i1"),
        ]
    )
    assert result.imported == 2
    assert indexed(data_dir, object_key)[("", "i1")] == "imported  words"
    assert hit_ids(indexed_session.search("imported")) == ["i1"]
    assert hit_ids(indexed_session.search("arrival")) == ["i2"]

    assert not indexed_session.import_message(text_message("i1", "different"), parent_id=None)
    assert indexed_session.search("different") == []
    assert indexed(data_dir, object_key)[("", "i1")] == "imported  words"


def test_hidden_overlay_rows_are_excluded(indexed_session: Any, data_dir: Path, object_key: str) -> None:
    """A stored `compaction_<X>` row whose X names one of the session's compaction records is a
    hidden echo of the overlay: never a search result. One without a record stays visible."""
    indexed_session.append_messages([text_message("m1", "first"), text_message("m2", "second")])
    record = indexed_session.add_compaction("the summary", "m1", "m2")
    indexed_session.import_message(text_message(f"compaction_{record.id}", "echoedoverlay"), parent_id="m2")
    indexed_session.import_message(text_message("compaction_unknown", "foreignoverlay"), parent_id="m2")

    # The echo is stored and indexed (import is verbatim); the query leaves it out.
    assert indexed(data_dir, object_key)[("", f"compaction_{record.id}")] == "echoedoverlay"
    assert indexed_session.search("echoedoverlay") == []
    assert indexed_session.search("echoedoverlay", all_sessions=True) == []
    assert hit_ids(indexed_session.search("foreignoverlay")) == ["compaction_unknown"]
    # The overlay is rendered on read and never indexed itself.
    assert indexed_session.search("summary") == []


# ── query semantics ──────────────────────────────────────────────────────────


def test_phrase_mode_needs_adjacent_words_in_order(session: Any) -> None:
    session.append_messages(
        [
            text_message("adjacent", "alpha gamma"),
            text_message("reversed", "gamma alpha"),
            text_message("apart", "alpha beta gamma"),
        ]
    )
    assert hit_ids(session.search("alpha gamma")) == ["adjacent"]
    assert hit_ids(session.search("gamma alpha")) == ["reversed"]
    assert sorted(hit_ids(session.search("alpha"))) == ["adjacent", "apart", "reversed"]


def test_phrase_mode_ignores_punctuation_between_words(session: Any) -> None:
    session.append_message(text_message("m1", "alpha, gamma!"))
    assert hit_ids(session.search("alpha gamma")) == ["m1"]
    assert hit_ids(session.search("alpha...gamma")) == ["m1"]


def test_all_words_mode_takes_each_word_once_and_at_most_32_of_them(session: Any) -> None:
    """FTS5 matches many words naming one token in time that grows with their count squared,
    where a search's deadline cannot stop it: 2,048 times "a" over a message of 5,000 "a"s ran
    47 s past a 2 s budget, holding a SQL thread. Repeats are dropped; more than 32 different
    words are refused."""
    session.append_message(text_message("many", " ".join(["a"] * 5_000)))
    assert hit_ids(session.search(" ".join(["a"] * 1_000), mode="all_words")) == ["many"]
    words = [f"a{'.' * n}" for n in range(1, 34)]  # 33 words, each the token "a"
    with pytest.raises(SessionsError) as refused:
        session.search(" ".join(words), mode="all_words")
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_EXCEEDED")
    assert "33 different words; the limit is 32" in refused.value.message
    assert hit_ids(session.search(" ".join(words[:32]), mode="all_words")) == ["many"]


def test_a_query_of_more_than_64_tokens_is_refused_in_either_mode(session: Any) -> None:
    """A phrase of 2,048 times "a" over one message of 300,000 "a"s held a SQL thread for 15.6 s
    past a 2 s budget (FTS5's phrase matching cannot be interrupted within a row), and with one
    search slot refused every other search meanwhile; so did one all-words "word" of many
    tokens ("a-a-a-...")."""
    session.append_message(text_message("many", " ".join(["a"] * 2_000)))
    for query, mode in ((" ".join(["a"] * 65), "phrase"), ("-".join(["a"] * 65), "all_words")):
        with pytest.raises(SessionsError) as refused:
            session.search(query, mode=mode)
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_EXCEEDED")
        assert refused.value.metadata["limit"] == "max_query_tokens"
        assert "65 words to match" in refused.value.message
    assert hit_ids(session.search(" ".join(["a"] * 64))) == ["many"]
    assert hit_ids(session.search("-".join(["a"] * 64), mode="all_words")) == ["many"]
    # Counted as the index's tokenizer counts: private-use characters are tokens, a combining
    # accent is part of its word.
    with pytest.raises(SessionsError) as private_use:
        session.search(" ".join(["\ue000"] * 65))
    assert private_use.value.metadata["limit"] == "max_query_tokens"
    assert hit_ids(session.search(" ".join(["e\u0301te\u0301"] * 40))) == []
    # A mark FTS5 splits words at (spacing, enclosing, and most non-spacing ones) ends a word
    # there, as a space would: counted as part of one word, "a\u0903" 1,024 times passed and held
    # a search slot 13.6 s past its 2 s budget (an audit). FTS5 counts them now.
    for mark in ("\u0903", "\u20dd", "\u0305", "\u064e"):
        with pytest.raises(SessionsError) as marked:
            session.search(("a" + mark) * 65)
        assert marked.value.metadata["limit"] == "max_query_tokens"
        assert "65 words to match" in marked.value.message
        assert hit_ids(session.search(("a" + mark) * 64)) == ["many"]


def test_all_words_mode_matches_every_word_in_any_order(session: Any) -> None:
    session.append_messages(
        [
            text_message("adjacent", "alpha gamma"),
            text_message("reversed", "gamma alpha"),
            text_message("apart", "alpha beta gamma"),
            text_message("half", "alpha only"),
        ]
    )
    assert sorted(hit_ids(session.search("gamma alpha", mode="all_words"))) == ["adjacent", "apart", "reversed"]
    assert sorted(hit_ids(session.search("  alpha   gamma  ", mode="all_words"))) == ["adjacent", "apart", "reversed"]
    assert session.search("alpha zeta", mode="all_words") == []


def test_tokenizer_is_porter_unicode61(session: Any) -> None:
    """Case folding, diacritics removed, porter stemming, exactly as FTS5's `porter unicode61`:
    deploying/deployed/deploys share the stem "deploy", while porter keeps "deployment" apart."""
    session.append_messages(
        [
            text_message("deployed", "we deployed it"),
            text_message("deploys", "she deploys daily"),
            text_message("deployment", "the deployment failed"),
            text_message("cafe", "Café RÉSUMÉ"),
            text_message("running", "running fast"),
        ]
    )
    assert sorted(hit_ids(session.search("deploying"))) == ["deployed", "deploys"]
    assert hit_ids(session.search("deployments")) == ["deployment"]
    assert hit_ids(session.search("cafe resume")) == ["cafe"]
    assert hit_ids(session.search("CAFÉ")) == ["cafe"]
    assert hit_ids(session.search("runs")) == ["running"]


def test_results_carry_id_role_indexed_text_and_session(session: Any) -> None:
    message = {
        "id": "m1",
        "role": "assistant",
        "parts": [text("the answer"), {"type": "reasoning", "text": "why"}, text("is 42")],
        "metadata": {"ignored": True},
    }
    session.append_message(message)
    assert [(r.id, r.role, r.content, r.session_id) for r in session.search("answer")] == [
        ("m1", "assistant", "the answer is 42", "")
    ]


def _with_lone_surrogate(message_id: str, word: str) -> str:
    """A message whose text holds a lone UTF-16 surrogate: valid JSON, and upstream stores it."""
    return '{"id":"' + message_id + '","role":"user","parts":[{"type":"text","text":"hello \\ud83d ' + word + '"}]}'


def test_text_with_a_lone_surrogate_is_indexed_and_found(session: Any, data_dir: Path, object_key: str) -> None:
    """Python's sqlite3 cannot bind such a text as a string: a message stored before the index
    existed made every search of the object fail (INTERNAL), and once it existed, each write of
    one failed. It is indexed as upstream's runtime stores it (the surrogate's own UTF-8 bytes),
    and a hit's text, a protobuf string, carries U+FFFD in its place."""
    session.append_message(_with_lone_surrogate("before", "first"))  # the index does not exist yet
    assert [(r.id, r.content) for r in session.search("first")] == [("before", "hello \ufffd first")]
    session.append_message(_with_lone_surrogate("after", "second"))
    session.append_messages([_with_lone_surrogate("batch1", "third"), _with_lone_surrogate("batch2", "third")])
    session.import_messages([ImportItem(_with_lone_surrogate("imported", "fourth"), "after")])
    session.update_message(_with_lone_surrogate("before", "fifth"))
    session.update_message(_with_lone_surrogate("before", "fifth"))  # unchanged: compared as stored
    for word, ids in (("second", ["after"]), ("third", ["batch1", "batch2"]), ("fourth", ["imported"])):
        assert sorted(hit_ids(session.search(word))) == ids, word
    assert [(r.id, r.content) for r in session.search("fifth")] == [("before", "hello \ufffd fifth")]
    assert session.search("first") == []
    with open_readonly(object_path(data_dir, object_key)) as conn:
        stored = conn.execute(f"SELECT CAST(content AS BLOB) FROM {FTS_TABLE} WHERE id = 'after'").fetchone()[0]
    assert stored == b"hello \xed\xa0\xbd second"


def test_results_are_best_match_first(session: Any) -> None:
    session.append_messages(
        [
            text_message("weak", "needle " + "filler " * 200),
            text_message("strong", "needle needle needle"),
            text_message("middle", "needle " + "filler " * 10),
        ]
    )
    assert hit_ids(session.search("needle")) == ["strong", "middle", "weak"]


# ── limits and the session filter ────────────────────────────────────────────


@pytest.fixture
def many_matches(session: Any) -> Any:
    """1,100 messages that all contain "common" (more than the cap)."""
    for start in (0, 550):
        session.append_messages([text_message(f"m{i:04d}", f"common {i}") for i in range(start, start + 550)])
    return session


def test_default_limit_is_20_and_an_explicit_limit_applies(many_matches: Any) -> None:
    assert len(many_matches.search("common")) == 20
    assert len(many_matches.search("common", limit=5)) == 5
    assert len(many_matches.search("common", limit=1)) == 1
    assert len(many_matches.search("common", limit=999)) == 999


def test_limit_is_capped_and_a_negative_limit_means_the_cap(many_matches: Any) -> None:
    """Upstream passes a negative limit straight to SQLite (no limit); ours applies the cap."""
    assert len(many_matches.search("common", limit=MAX_LIMIT + 500)) == MAX_LIMIT
    assert len(many_matches.search("common", limit=2**31 - 1)) == MAX_LIMIT
    assert len(many_matches.search("common", limit=-1)) == MAX_LIMIT
    results = many_matches.search("common", limit=-5, mode="all_words")
    assert len(results) == MAX_LIMIT
    assert len(set(hit_ids(results))) == MAX_LIMIT


def test_unset_limit_means_20_and_zero_means_none(stub: Any, many_matches: Any, object_key: str) -> None:
    unset = list(stub.SearchMessages(pb.SearchMessagesRequest(object_key=object_key, query="common")))
    assert len([r for r in unset if not r.more_pieces]) == 20
    # 0 is upstream's `LIMIT 0`: no results (the field has presence, so 0 is not "unset").
    zero = list(stub.SearchMessages(pb.SearchMessagesRequest(object_key=object_key, query="common", limit=0)))
    assert zero == []


def test_search_is_limited_to_the_session_unless_all_sessions(obj: Any) -> None:
    a, b, empty = obj.session("a"), obj.session("b"), obj.session("empty")
    a.append_message(text_message("same-id", "sharedterm from a"))
    b.append_message(text_message("same-id", "sharedterm from b"))
    b.append_message(text_message("b-only", "sharedterm only b"))

    assert [(r.session_id, r.id, r.content) for r in a.search("sharedterm")] == [("a", "same-id", "sharedterm from a")]
    assert sorted((r.session_id, r.id) for r in b.search("sharedterm")) == [("b", "b-only"), ("b", "same-id")]
    assert empty.search("sharedterm") == []
    everywhere = empty.search("sharedterm", all_sessions=True)
    assert sorted((r.session_id, r.id) for r in everywhere) == [("a", "same-id"), ("b", "b-only"), ("b", "same-id")]
    assert len(a.search("sharedterm", all_sessions=True, limit=2)) == 2


def test_search_of_an_object_without_messages_is_empty(session: Any) -> None:
    assert session.search("anything") == []
    assert session.search("anything", all_sessions=True, mode="all_words") == []


# ── hostile queries ──────────────────────────────────────────────────────────

HOSTILE_QUERIES = [
    "",
    " ",
    "\t\n",
    '"',
    '""',
    '"""',
    'say "hi"',
    'alpha"',
    "alpha AND beta",
    "alpha OR beta",
    "alpha NOT beta",
    "AND",
    "OR",
    "NOT",
    "NEAR(",
    "NEAR(alpha beta)",
    "NEAR(alpha beta, 2)",
    "alpha NEAR beta",
    "*",
    "alph*",
    "alpha *",
    "^",
    "^alpha",
    "content:alpha",
    "content: alpha",
    "id:x",
    "role:user",
    "session_id:a",
    "{content id}: alpha",
    "- content : alpha",
    "(",
    ")",
    "(alpha OR beta)",
    "((((",
    "!!!",
    "...",
    "+",
    "-",
    ":",
    "'",
    "`",
    "\\",
    "\\x00",
    "%",
    "_",
    ";",
    "alpha; DROP TABLE cf_agents_session_fts; --",
    "' OR 1=1 --",
    "rank",
    "bm25(cf_agents_session_fts)",
    "cf_agents_session_fts",
    "\u200b",
    "🙂",
    "alpha 🙂 beta",
    "\ud7ff\ue000",
    "ǅ ß İ",
]


@pytest.fixture
def hostile_target(session: Any) -> Any:
    session.append_messages(
        [
            text_message("plain", "alpha beta"),
            text_message("operators", "alpha AND beta OR gamma NOT delta"),
            text_message("near", "NEAR(alpha beta) and alph* and ^alpha"),
            text_message("columns", "content: alpha and id: x"),
            text_message("quoted", 'say "hi" to alpha'),
        ]
    )
    return session


@pytest.mark.parametrize("mode", ["phrase", "all_words"])
def test_hostile_queries_answer_without_errors(hostile_target: Any, mode: str) -> None:
    known = {"plain", "operators", "near", "columns", "quoted"}
    for query in HOSTILE_QUERIES:
        try:
            results = hostile_target.search(query, mode=mode)
        except SessionsError as error:  # pragma: no cover - reported with the query
            pytest.fail(f"query {query!r} ({mode}) failed: {error}")
        assert isinstance(results, list)
        assert set(hit_ids(results)) <= known, query


@pytest.mark.parametrize("query", ["", " ", "!!!", "...", '"', '""', "*", "^", "(", ")", ":", "\u200b"])
def test_queries_without_words_return_nothing(hostile_target: Any, query: str) -> None:
    assert hostile_target.search(query) == []
    assert hostile_target.search(query, mode="all_words") == []


def test_fts_operators_are_literal_words(hostile_target: Any) -> None:
    # "alpha AND beta" is the phrase alpha-and-beta, not a boolean AND.
    assert hit_ids(hostile_target.search("alpha AND beta")) == ["operators"]
    assert hit_ids(hostile_target.search("beta OR gamma")) == ["operators"]
    assert hostile_target.search("alpha OR zzzz") == []
    assert hostile_target.search("alpha NOT zzzz") == []
    # In all-words mode every word is still literal: "OR" must itself occur.
    assert hit_ids(hostile_target.search("gamma OR alpha", mode="all_words")) == ["operators"]
    assert hit_ids(hostile_target.search("NOT delta", mode="all_words")) == ["operators"]


def test_near_star_caret_and_column_filters_are_literal(hostile_target: Any) -> None:
    assert hit_ids(hostile_target.search("NEAR(alpha beta)")) == ["near"]
    # No prefix query: "alph*" is the word "alph", which only the "near" message contains.
    assert hit_ids(hostile_target.search("alph*")) == ["near"]
    assert hit_ids(hostile_target.search("alph*", mode="all_words")) == ["near"]
    # No initial-token query: "^alpha" is just "alpha" (every message has it).
    assert len(hostile_target.search("^alpha")) == 5
    # No column filter: "content:alpha" is the phrase "content alpha".
    assert hit_ids(hostile_target.search("content:alpha")) == ["columns"]
    assert hit_ids(hostile_target.search("id:x")) == ["columns"]
    assert hostile_target.search("role:user") == []


def test_quotes_inside_the_query_are_literal(hostile_target: Any) -> None:
    assert hit_ids(hostile_target.search('say "hi"')) == ["quoted"]
    assert hit_ids(hostile_target.search('"hi" to')) == ["quoted"]
    assert hit_ids(hostile_target.search('"say" "hi"', mode="all_words")) == ["quoted"]


def test_nul_in_the_query_is_invalid_argument(hostile_target: Any) -> None:
    for mode in ("phrase", "all_words"):
        with pytest.raises(SessionsError) as caught:
            hostile_target.search("alpha\x00beta", mode=mode)
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "NUL" in caught.value.message


def test_query_length_limit(hostile_target: Any) -> None:
    assert len(hostile_target.search("a" * MAX_QUERY_BYTES)) == 0
    for query in ("a" * (MAX_QUERY_BYTES + 1), "x" * 65536, "é" * (MAX_QUERY_BYTES // 2 + 1)):
        for mode in ("phrase", "all_words"):
            with pytest.raises(SessionsError) as caught:
                hostile_target.search(query, mode=mode)
            assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.reason == "LIMIT_EXCEEDED"
            assert str(MAX_QUERY_BYTES) in caught.value.message


def test_unknown_search_mode_on_the_wire_is_invalid_argument(stub: Any, hostile_target: Any, object_key: str) -> None:
    request = pb.SearchMessagesRequest(object_key=object_key, query="alpha", mode=99)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.SearchMessages(request))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_failed_query_leaves_the_object_working(hostile_target: Any) -> None:
    with pytest.raises(SessionsError) as refused:
        hostile_target.search("\x00")
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    hostile_target.append_message(text_message("after", "still works"))
    assert hit_ids(hostile_target.search("still works")) == ["after"]


# ── time budget ──────────────────────────────────────────────────────────────


@pytest.fixture
def budget_server(tmp_path: Path) -> Iterator[Any]:
    from tests.conftest import start_server

    server = start_server(tmp_path / "data", search_seconds=0.000001)
    yield server
    server.stop()


def test_a_search_over_its_time_budget_is_interrupted(budget_server: Any) -> None:
    from sessions_client import SessionsClient

    with SessionsClient(budget_server.address) as client:
        session = client.object("budget").session()
        for start in range(0, 4000, 1000):
            session.append_messages(
                [
                    text_message(f"m{i}", f"common word number {i} " + "padding " * 20)
                    for i in range(start, start + 1000)
                ]
            )
        for mode in ("phrase", "all_words"):
            with pytest.raises(SessionsError) as caught:
                session.search("common", mode=mode, limit=-1)
            assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "budget" in caught.value.message
            assert "search_seconds" in caught.value.message or "search-seconds" in caught.value.message
        # The object keeps serving: writes and other reads are unaffected.
        session.append_message(text_message("after", "fine"))
        assert session.get_message("after") is not None


def test_the_index_survives_a_direct_sqlite_look(session: Any, data_dir: Path, object_key: str) -> None:
    """The FTS table is a standard FTS5 table any SQLite can query (upstream's file format)."""
    session.append_message(text_message("m1", "portable text"))
    session.search("portable")
    with open_readonly(object_path(data_dir, object_key)) as conn:
        try:
            rows = conn.execute(f"SELECT id FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?", ('"portable"',)).fetchall()
        except sqlite3.OperationalError as exc:  # pragma: no cover
            pytest.fail(f"the index is not readable with stock SQLite: {exc}")
    assert [r[0] for r in rows] == ["m1"]


def test_an_imported_index_filled_by_upstream_gets_the_messages_it_left_out(tmp_path: Path) -> None:
    """Upstream's backfill skips a message whose first row is not whole JSON (one with
    continuation rows). An imported store whose index upstream had made was taken as fully
    indexed: such a message stayed unfound for good. Now its first search indexes what is
    missing; an index this service filled is taken as it is."""
    import contextlib
    import shutil

    from sessions_client import SessionsClient
    from sessions_server.storage import files
    from sessions_server.storage.queries import FTS_DDL
    from tests.conftest import start_server

    big = text_message("big", "zebraword " + "lorem ipsum " * 200_000)  # continuation rows
    origin = start_server(tmp_path / "origin")
    try:
        with SessionsClient(origin.address) as client:
            session = client.object("store").session()
            session.append_message(text_message("small", "alpha word"))
            session.append_message(big)
            client.object("ours").session().append_message(text_message("m1", "beta word"))
            assert [hit.id for hit in client.object("ours").session().search("beta")] == ["m1"]  # filled here
    finally:
        origin.stop()
    upstream = shutil.copy(object_path(tmp_path / "origin", "store"), tmp_path / "upstream.sqlite")
    with contextlib.closing(sqlite3.connect(upstream)) as conn:
        assert conn.execute("SELECT content_chunks FROM cf_agents_session_messages WHERE id = 'big'").fetchone()[0]
        conn.execute("DROP TABLE _sessions_meta")  # upstream has none
        conn.execute(FTS_DDL)
        conn.execute(  # upstream's first search: one statement over the rows whose content is whole JSON
            """INSERT INTO cf_agents_session_fts (id, session_id, role, content)
               SELECT m.id, m.session_id, m.role, group_concat(json_extract(p.value, '$.text'), ' ')
               FROM cf_agents_session_messages m, json_each(m.content, '$.parts') p
               WHERE json_valid(m.content) AND json_extract(p.value, '$.type') = 'text'
               GROUP BY m.session_id, m.id"""
        )
        assert [row[0] for row in conn.execute("SELECT id FROM cf_agents_session_fts")] == ["small"]
        conn.commit()
    data_dir = tmp_path / "data"
    files.import_store_file(upstream, "imported", data_dir)
    files.import_store_file(object_path(tmp_path / "origin", "ours"), "ours", data_dir)
    with open_readonly(object_path(data_dir, "ours")) as conn:  # no second backfill of an index filled here
        assert conn.execute("SELECT 1 FROM _sessions_meta WHERE key = 'search_backfill_after'").fetchone() is None
    server = start_server(data_dir)
    try:
        with SessionsClient(server.address) as client:
            session = client.object("imported").session()
            assert [hit.id for hit in session.search("zebraword")] == ["big"]
            assert [hit.id for hit in session.search("alpha")] == ["small"]
            assert [hit.id for hit in client.object("ours").session().search("beta")] == ["m1"]
    finally:
        server.stop()
