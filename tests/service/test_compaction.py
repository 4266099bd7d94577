"""Compaction overlays (issue 6; reference notes §6, §7, §12 "Compaction and overlays"): records,
the synthetic overlay message, overlay selection, overlays in every read mode, hidden overlay
rows, and the refusal of `compaction_` ids on every write path.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest

from sessions_client import CompactionRecord
from tests.service.chat_completions_stub import FeedReader
from tests.service.support import message_rows, text_message

ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def turns(session: Any, count: int, start: int = 0) -> list[str]:
    ids = [f"m{i}" for i in range(start, start + count)]
    session.append_messages(
        [text_message(i, f"turn {i} text", role="user" if n % 2 == 0 else "assistant") for n, i in enumerate(ids)]
    )
    return ids


def oid(record: CompactionRecord) -> str:
    return "compaction_" + record.id


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


def assert_overlay(message: dict[str, Any], record: CompactionRecord) -> None:
    assert list(message) == ["id", "role", "parts", "createdAt"]
    assert message["id"] == oid(record)
    assert message["role"] == "assistant"
    assert message["parts"] == [{"type": "text", "text": record.summary}]
    assert isinstance(message["createdAt"], str) and ISO_MS.match(message["createdAt"]), message["createdAt"]


def all_reads(session: Any, leaf_id: str | None = None) -> dict[str, list[str]]:
    """The ids every path read yields; newest-first reads are reversed back to root-first."""
    recent = session.get_recent_history(10**9, leaf_id=leaf_id)
    return {
        "forward": ids(session.get_history(leaf_id=leaf_id)),
        "newest_first": ids(session.get_history(leaf_id=leaf_id, newest_first=True))[::-1],
        "batches": [m["id"] for b in session.history_batches(batch_size=2, leaf_id=leaf_id) for m in b],
        "batches_newest_first": [
            m["id"] for b in session.history_batches(batch_size=3, leaf_id=leaf_id, newest_first=True) for m in b
        ][::-1],
        "recent": ids(recent.messages),
    }


def assert_all_reads(session: Any, expected: list[str], leaf_id: str | None = None) -> None:
    for name, got in all_reads(session, leaf_id).items():
        assert got == expected, name


# ── records ─────────────────────────────────────────────────────────────────


def test_add_compaction_stores_a_record_without_validating_ids(session: Any):
    before = int(time.time() * 1000)
    record = session.add_compaction("summary one", "nope", "never")
    after = int(time.time() * 1000)
    assert uuid.UUID(record.id).version == 4
    assert (record.seq, record.summary, record.from_message_id, record.to_message_id) == (
        1,
        "summary one",
        "nope",
        "never",
    )
    assert before <= record.created_at_ms <= after
    assert session.list_compactions() == [record]
    assert session.get_history() == []


def test_records_number_max_plus_one_per_session_and_list_all_oldest_first(obj: Any):
    session, other = obj.session("a"), obj.session("b")
    turns(session, 6)
    first = session.add_compaction("first", "m1", "m3")
    second = session.add_compaction("superseded by none", "m1", "m2")  # newer, same start
    third = session.add_compaction("reversed", "m4", "m2")  # never applies
    elsewhere = other.add_compaction("other session", "x", "y")
    assert [r.seq for r in (first, second, third)] == [1, 2, 3]
    assert elsewhere.seq == 1
    assert session.list_compactions() == [first, second, third]
    assert other.list_compactions() == [elsewhere]
    assert len({first.id, second.id, third.id}) == 3


def test_clear_removes_records_and_numbering_restarts(session: Any):
    turns(session, 6)
    session.add_compaction("s", "m1", "m3")
    session.add_compaction("t", "m2", "m4")
    session.clear_messages()
    assert session.list_compactions() == []
    assert session.get_latest_leaf() is None
    assert session.add_compaction("u", "a", "b").seq == 1


def test_add_compaction_emits_compaction_event_with_the_record(live_server: Any, session: Any, object_key: str):
    turns(session, 4)
    with FeedReader(live_server.address, object_key) as feed:
        record = session.add_compaction("sum", "m1", "m2")
        event = feed.next()
    assert (event.type, event.session_id, event.compaction, event.message) == ("compaction", "", record, None)


def test_originals_are_never_modified(session: Any, object_key: str, data_dir: Any):
    turns(session, 6)
    before = message_rows(data_dir, object_key)
    session.add_compaction("s", "m1", "m4")
    assert message_rows(data_dir, object_key) == before
    assert session.get_message("m2") == text_message("m2", "turn m2 text", role="user")


# ── the overlay in every read ───────────────────────────────────────────────


def test_synthetic_overlay_message_shape(session: Any):
    turns(session, 6)
    record = session.add_compaction("the summary", "m1", "m3")
    history = session.get_history()
    assert ids(history) == ["m0", oid(record), "m4", "m5"]
    assert_overlay(history[1], record)
    assert_all_reads(session, ["m0", oid(record), "m4", "m5"])
    # It never exists as a row.
    assert session.get_message(oid(record)) is None
    assert session.get_messages([oid(record), "m0"]) == [None, session.get_message("m0")]


def test_newest_first_is_the_exact_reverse_with_overlays(session: Any):
    turns(session, 10)
    a = session.add_compaction("A", "m1", "m2")
    b = session.add_compaction("B", "m4", "m6")
    session.add_compaction("starts inside B", "m5", "m7")  # ignored, but its end triggers the switch
    session.add_compaction("ghost start", "ghost", "m8")  # never applies; also ends on the path
    forward = session.get_history()
    assert ids(forward) == ["m0", oid(a), "m3", oid(b), "m7", "m8", "m9"]
    newest = session.get_history(newest_first=True)
    assert ids(newest) == ids(forward)[::-1]
    assert_overlay(newest[3], b)
    assert_overlay(newest[5], a)
    assert next(iter(session.history(newest_first=True)))["id"] == "m9"


def test_newest_first_switches_at_an_overlay_ending_at_the_leaf(session: Any):
    turns(session, 6)
    record = session.add_compaction("tail", "m3", "m5")
    assert ids(session.get_history(newest_first=True)) == [oid(record), "m2", "m1", "m0"]
    assert ids(session.get_history()) == ["m0", "m1", "m2", oid(record)]
    assert session.get_latest_leaf()["id"] == "m5"  # not overlay-aware


def test_batches_count_the_overlay_as_one_message(session: Any):
    turns(session, 8)
    record = session.add_compaction("S", "m1", "m4")
    batches = list(session.history_batches(batch_size=2))
    assert [ids(b) for b in batches] == [["m0", oid(record)], ["m5", "m6"], ["m7"]]
    newest = list(session.history_batches(batch_size=2, newest_first=True))
    assert [ids(b) for b in newest] == [["m7", "m6"], ["m5", oid(record)], ["m0"]]


def test_recent_history_applies_an_overlay_only_when_it_lies_inside_the_window(session: Any):
    turns(session, 6)
    record = session.add_compaction("S", "m1", "m3")
    stats = session.get_history_row_stats()
    assert [s.id for s in stats] == ["m0", "m1", "m2", "m3", "m4", "m5"]  # raw rows, no overlay
    size = {s.id: s.bytes for s in stats}

    whole = session.get_recent_history(sum(size.values()))
    assert ids(whole.messages) == ["m0", oid(record), "m4", "m5"]
    assert not whole.truncated
    assert whole.total_content_bytes == sum(size.values())

    from_start = session.get_recent_history(sum(size[i] for i in ("m1", "m2", "m3", "m4", "m5")))
    assert ids(from_start.messages) == [oid(record), "m4", "m5"]
    assert from_start.truncated

    inside = session.get_recent_history(sum(size[i] for i in ("m2", "m3", "m4", "m5")))
    assert ids(inside.messages) == ["m2", "m3", "m4", "m5"]  # the overlay starts outside: raw rows
    assert inside.truncated
    assert inside.total_content_bytes == sum(size.values())


def test_get_branches_applies_no_overlay(session: Any):
    turns(session, 5)
    session.add_compaction("S", "m1", "m3")
    assert ids(session.get_branches("m0")) == ["m1"]
    assert ids(session.get_branches("m2")) == ["m3"]


# ── which records apply ─────────────────────────────────────────────────────


def test_newest_record_with_the_same_start_wins_even_if_shorter(session: Any):
    turns(session, 6)
    session.add_compaction("long", "m1", "m4")
    short = session.add_compaction("short", "m1", "m2")
    assert_all_reads(session, ["m0", oid(short), "m3", "m4", "m5"])


def test_record_starting_inside_an_applied_span_is_ignored_even_if_it_extends_beyond(session: Any):
    turns(session, 7)
    outer = session.add_compaction("outer", "m1", "m3")
    session.add_compaction("inner", "m2", "m5")
    assert_all_reads(session, ["m0", oid(outer), "m4", "m5", "m6"])


def test_outer_record_starting_earlier_swallows_inner_ones(session: Any):
    turns(session, 7)
    session.add_compaction("inner", "m2", "m3")
    outer = session.add_compaction("outer", "m1", "m4")
    assert_all_reads(session, ["m0", oid(outer), "m5", "m6"])


def test_from_equal_to_is_a_one_row_span(session: Any):
    turns(session, 4)
    one = session.add_compaction("one", "m2", "m2")
    assert_all_reads(session, ["m0", "m1", oid(one), "m3"])


@pytest.mark.parametrize(("from_id", "to_id"), [("m3", "m1"), ("ghost", "m3"), ("m1", "ghost"), ("m2", "m2x")])
def test_reversed_or_off_path_records_are_ignored(session: Any, from_id: str, to_id: str):
    turns(session, 5)
    session.add_compaction("ignored", from_id, to_id)
    assert_all_reads(session, ["m0", "m1", "m2", "m3", "m4"])


def test_records_apply_only_where_both_ends_are_on_the_branch_read(session: Any):
    turns(session, 4)  # m0..m3
    session.append_message(text_message("b2", "branch 2"), parent_id="m1")
    session.append_message(text_message("b3", "branch 3"))
    main = session.add_compaction("main", "m2", "m3")
    branch = session.add_compaction("branch", "m1", "b3")
    assert_all_reads(session, ["m0", oid(branch)], leaf_id="b3")
    assert_all_reads(session, ["m0", "m1", oid(main)], leaf_id="m3")
    assert ids(session.get_history()) == ["m0", oid(branch)]  # b3 is the active leaf


# ── hidden overlay rows (0.32) ──────────────────────────────────────────────


def test_hidden_overlay_row_is_skipped_and_walked_through(session: Any, object_key: str, data_dir: Any):
    turns(session, 4, start=1)  # m1..m4
    record = session.add_compaction("S", "m2", "m3")
    hidden = oid(record)
    echoed = {"id": hidden, "role": "assistant", "parts": [{"type": "text", "text": "S"}]}
    assert session.import_message(echoed, parent_id="m4", created_at=1_700_000_000_000)
    assert hidden in [r["id"] for r in message_rows(data_dir, object_key)]

    assert session.get_latest_leaf()["id"] == "m4"  # the newest row is hidden
    appended = session.append_message(text_message("m5", "after the echo"))
    assert appended.parent_id == hidden  # appends still attach under the raw max-seq row

    expected = ["m1", hidden, "m4", "m5"]  # the overlay once, the child in the hidden row's place
    assert_all_reads(session, expected)
    history = session.get_history()
    assert_overlay(history[1], record)
    assert [s.id for s in session.get_history_row_stats()] == ["m1", "m2", "m3", "m4", "m5"]
    assert ids(session.get_branches("m4")) == ["m5"]
    assert session.get_latest_leaf()["id"] == "m5"
    # getMessage is not overlay-aware: the hidden row is readable by id.
    assert session.get_message(hidden) == echoed

    # A branch off m5 still walks through the hidden row.
    session.append_message(text_message("b6", "branch"), parent_id="m5")
    assert_all_reads(session, ["m1", hidden, "m4", "m5", "b6"], leaf_id="b6")


def test_hidden_row_between_two_compactions_appears_once_in_every_read(session: Any):
    session.append_messages([text_message(f"m{i}", f"turn {i}") for i in range(3)])
    a = session.add_compaction("A", "m1", "m2")
    session.import_message(text_message(oid(a), "A", role="assistant"), parent_id="m2", created_at=1)
    session.append_messages([text_message(f"m{i}", f"turn {i}") for i in range(3, 7)])  # m3 under the hidden row
    b = session.add_compaction("B", "m4", "m5")
    assert_all_reads(session, ["m0", oid(a), "m3", oid(b), "m6"])
    assert ids(session.get_history(newest_first=True)) == ["m6", oid(b), "m3", oid(a), "m0"]


def test_hidden_rows_replaced_by_their_children_in_get_branches_sorted_by_seq(session: Any):
    turns(session, 3)  # m0..m2
    record = session.add_compaction("S", "m1", "m1")
    hidden = oid(record)
    session.import_message(text_message(hidden, "S", role="assistant"), parent_id="m2", created_at=1)
    session.import_message(text_message("c1", "under hidden"), parent_id=hidden, created_at=2)
    session.append_message(text_message("c2", "direct"), parent_id="m2")
    session.import_message(text_message("c3", "under hidden too"), parent_id=hidden, created_at=3)
    assert ids(session.get_branches("m2")) == ["c1", "c2", "c3"]


def test_compaction_row_without_a_local_record_is_an_ordinary_visible_row(session: Any):
    turns(session, 2)
    foreign = text_message("compaction_from-elsewhere", "imported summary", role="assistant")
    session.import_message(foreign, parent_id="m1", created_at=1)
    session.append_message(text_message("m2", "next"))
    assert_all_reads(session, ["m0", "m1", "compaction_from-elsewhere", "m2"])
    assert session.get_history()[2] == foreign
    assert ids(session.get_branches("m1")) == ["compaction_from-elsewhere"]
    assert ids(session.get_branches("compaction_from-elsewhere")) == ["m2"]


# ── writes of overlay ids are refused ───────────────────────────────────────


def test_writes_of_overlay_ids_are_refused(live_server: Any, session: Any, object_key: str, data_dir: Any):
    turns(session, 4)
    record = session.add_compaction("S", "m1", "m2")
    echoes = [
        {"id": oid(record), "role": "assistant", "parts": [{"type": "text", "text": "S"}], "createdAt": "x"},
        text_message("compaction_unknown", "no record", role="assistant"),
    ]
    rows_before = message_rows(data_dir, object_key)
    with FeedReader(live_server.address, object_key) as feed:
        for echo in echoes:
            appended = session.append_message(echo)
            assert (appended.inserted, appended.message) == (False, echo)
            upserted = session.upsert_message(echo)
            assert (upserted.inserted, upserted.changed) == (False, False)
            upserted = session.upsert_message(echo, source="client")
            assert (upserted.inserted, upserted.changed) == (False, False)
            assert session.update_message(echo) is None
        batch = session.append_messages([text_message("m4", "real"), echoes[0], text_message("m5", "real too")])
        assert [r.inserted for r in batch] == [True, False, True]
        assert batch[2].parent_id == "m4"
        # Nothing was dispatched for the refused writes: the first events are the batch's appends.
        events = [feed.next(), feed.next()]
        assert [(e.type, e.message and e.message["id"]) for e in events] == [("append", "m4"), ("append", "m5")]
    rows = message_rows(data_dir, object_key)
    assert [r["id"] for r in rows] == [r["id"] for r in rows_before] + ["m4", "m5"]
    appended = session.append_message(text_message("m6", "next"))
    assert appended.parent_id == "m5"  # the next append attaches to the real leaf
    assert ids(session.get_history()) == ["m0", oid(record), "m3", "m4", "m5", "m6"]
