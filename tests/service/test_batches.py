"""historyBatches rules (reference notes §6): split before a message when the batch is full by
count or would pass the byte limit, after a message when it reached either; never empty; an
oversized message stands alone. A message's size is the UTF-8 length of its JSON."""

from __future__ import annotations

from typing import Any

from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import ids, js_json, text_message, utf8_len


def five_equal(session: Any) -> list[dict[str, Any]]:
    messages = [text_message(f"m{i}", "same size text") for i in range(5)]
    session.append_messages(messages)
    return messages


def test_batches_by_count(session: Any) -> None:
    messages = five_equal(session)
    batches = list(session.history_batches(batch_size=2))
    assert [len(b) for b in batches] == [2, 2, 1]
    assert [m for b in batches for m in b] == messages


def test_batches_by_bytes_of_one_message_plus_ten(session: Any) -> None:
    messages = five_equal(session)
    size = utf8_len(js_json(messages[0]))
    batches = list(session.history_batches(max_batch_bytes=size + 10))
    assert [ids(b) for b in batches] == [[m["id"]] for m in messages]


def test_batches_by_bytes_fill_up_to_the_limit(session: Any) -> None:
    messages = five_equal(session)
    size = utf8_len(js_json(messages[0]))
    assert [len(b) for b in session.history_batches(max_batch_bytes=2 * size)] == [2, 2, 1]
    assert [len(b) for b in session.history_batches(max_batch_bytes=2 * size - 1)] == [1, 1, 1, 1, 1]
    assert [len(b) for b in session.history_batches(max_batch_bytes=3 * size + 1)] == [3, 2]


def test_oversized_message_stands_alone(session: Any) -> None:
    small = [text_message(f"s{i}", "small") for i in range(4)]
    big = text_message("big", "B" * 5_000)
    session.append_messages([small[0], small[1], big, small[2], small[3]])
    limit = 2 * utf8_len(js_json(small[0])) + 5

    batches = list(session.history_batches(max_batch_bytes=limit))

    assert [ids(b) for b in batches] == [["s0", "s1"], ["big"], ["s2", "s3"]]


def test_both_limits_apply(session: Any) -> None:
    messages = [text_message(f"m{i}", "x") for i in range(7)]
    session.append_messages(messages)
    size = utf8_len(js_json(messages[0]))
    assert [len(b) for b in session.history_batches(batch_size=3, max_batch_bytes=10 * size)] == [3, 3, 1]
    assert [len(b) for b in session.history_batches(batch_size=3, max_batch_bytes=2 * size)] == [2, 2, 2, 1]


def test_batches_newest_first_and_of_another_leaf(session: Any) -> None:
    messages = five_equal(session)
    session.append_message(text_message("branch"), parent_id="m1")
    batches = list(session.history_batches(batch_size=2, leaf_id="m4", newest_first=True))
    assert [ids(b) for b in batches] == [["m4", "m3"], ["m2", "m1"], ["m0"]]
    assert batches[0][0] == messages[4]
    assert [ids(b) for b in session.history_batches(batch_size=2)] == [["m0", "m1"], ["branch"]]


def test_batch_ends_are_marked_on_the_wire(session: Any, stub: Any, object_key: str) -> None:
    five_equal(session)
    request = pb.StreamHistoryRequest(object_key=object_key, batch_size=2)
    responses = list(stub.StreamHistory(request))
    assert [r.frame.info.id for r in responses] == [f"m{i}" for i in range(5)]
    assert [r.batch_end for r in responses] == [False, True, False, True, True]
    unbatched = list(stub.StreamHistory(pb.StreamHistoryRequest(object_key=object_key)))
    assert [r.frame.info.id for r in unbatched] == [f"m{i}" for i in range(5)]
