"""The path depth cap (10,001 stored rows) and the 1,572,864-byte row budget (reference notes §3, §6)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conformance.harness.canon import canon
from tests.conformance.harness.messages import msg
from tests.conformance.harness.pair import Pair

BUDGET = 1_572_864


def _bulk_ours(pair: Pair, count: int, text_bytes: int, prefix: str) -> None:
    """Our side of the oracle's bulkAppend: the same ids, roles and text, in batches of 1,000."""
    text = "x" * text_bytes
    session = pair.ours()
    for start in range(0, count, 1000):
        batch = [
            {
                "id": f"{prefix}-{i}",
                "role": "user" if i % 2 == 0 else "assistant",
                "parts": [{"type": "text", "text": text}],
            }
            for i in range(start, min(count, start + 1000))
        ]
        results = session.append_messages(batch)
        assert all(r.inserted for r in results)


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    ids = [m["id"] for m in result["messages"]]
    return {
        "count": len(ids),
        "first": ids[:2],
        "last": ids[-2:],
        "truncated": result["truncated"],
        "total": result["totalContentBytes"],
    }


def _recent(pair: Pair, budget: int) -> None:
    up = pair.oracle.call(pair.key, "", "getRecentHistory", {"maxContentBytes": budget})
    ours = pair.ours().get_recent_history(budget)
    our_view = {"messages": ours.messages, "truncated": ours.truncated, "totalContentBytes": ours.total_content_bytes}
    assert _summary(up) == _summary(our_view), f"getRecentHistory({budget})"
    assert [canon(m) for m in up["messages"]] == [canon(m) for m in ours.messages], f"getRecentHistory({budget})"


def _history_ids(pair: Pair, options: dict[str, Any]) -> None:
    up = pair.oracle.call(pair.key, "", "getHistory", {"summary": True, "options": options})
    ours = [
        m["id"]
        for m in pair.ours().history(leaf_id=options.get("leafId"), newest_first=bool(options.get("newestFirst")))
    ]
    assert (up["count"], up["ids"]) == (len(ours), ours), f"getHistory({options})"


def _row_stats(pair: Pair) -> None:
    up = pair.oracle.call(pair.key, "", "getHistoryRowStats", {})
    ours = pair.ours().get_history_row_stats()
    assert [(s["id"], s["role"], s["bytes"], s["tokenEstimate"]) for s in up] == [
        (s.id, s.role, s.bytes, s.token_estimate) for s in ours
    ]


def test_depth_cap(make_pair: Callable[..., Pair]) -> None:
    """A 10,001-row path is read whole (not truncated); at 10,002 rows reads stop at the cap and
    getRecentHistory says `truncated`. Upstream builds the chain with its in-object bulkAppend, we
    with AppendMessages batches of 1,000: the stored rows are compared first, so both chains are
    provably the same."""
    pair = make_pair(level="rows")
    up_bulk = pair.oracle.call(pair.key, "", "bulkAppend", {"count": 10_001, "textBytes": 10, "idPrefix": "m"})
    assert up_bulk["count"] == 10_001
    _bulk_ours(pair, 10_001, 10, "m")
    pair.check(level="rows")  # ids, parents, seq, content, estimates and digests all equal
    _recent(pair, 10**12)
    _recent(pair, 5_000)
    _row_stats(pair)
    _history_ids(pair, {"newestFirst": True})

    pair.append({"id": "m-10001", "role": "assistant", "parts": [{"type": "text", "text": "x" * 10}]}, check=False)
    pair.check(level="rows")
    _recent(pair, 10**12)
    _row_stats(pair)
    _history_ids(pair, {})
    _history_ids(pair, {"leafId": "m-10000", "newestFirst": True})
    up_batches = pair.oracle.call(pair.key, "", "historyBatches", {"summary": True, "options": {"batchSize": 777}})
    our_batches = [[m["id"] for m in b] for b in pair.ours().history_batches(batch_size=777)]
    assert up_batches["batchIds"] == our_batches


def _text_message_of_size(mid: str, total_bytes: int, tail: str = "") -> dict[str, Any]:
    """A one-text-part message whose JSON is exactly `total_bytes` UTF-8 bytes, ending in `tail`."""
    empty = len(json.dumps(msg(mid, "", role="user"), separators=(",", ":"), ensure_ascii=False).encode())
    fill = total_bytes - empty - len(tail.encode("utf-8"))
    out = msg(mid, "a" * fill + tail, role="user")
    size = len(json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode())
    assert size == total_bytes, (size, total_bytes)
    return out


@pytest.mark.parametrize("delta", [-1, 0, 1], ids=["one-under", "exact", "one-over"])
def test_row_budget_boundary(make_pair: Callable[..., Pair], delta: int) -> None:
    pair = make_pair(level="light")
    pair.append(_text_message_of_size("b", BUDGET + delta))
    row = pair.up_rows.row("", "b")
    assert row is not None and row["content_chunks"] == (1 if delta > 0 else 0), "upstream no longer at the boundary"
    pair.update(_text_message_of_size("b", BUDGET + delta + 1))
    pair.update(_text_message_of_size("b", BUDGET + delta - 1))
    pair.append(_text_message_of_size("c", 2 * BUDGET + delta))


@pytest.mark.parametrize(
    ("name", "char", "offset"),
    [
        ("emoji-straddles-cut", "😀", 2),  # the 4-byte pair would end 2 bytes past the budget
        ("emoji-ends-at-cut", "😀", 0),
        ("emoji-one-past", "😀", 1),
        ("cjk-straddles-cut", "中", 1),
        ("two-byte-straddles-cut", "é", 1),
    ],
)
def test_multibyte_at_the_cut(make_pair: Callable[..., Pair], name: str, char: str, offset: int) -> None:
    """The message's bytes put `char` across (or at) byte 1,572,864; the closing `"}]}` follows."""
    pair = make_pair(level="light")
    closing = len('"}]}')
    size = BUDGET + offset + closing
    pair.append(_text_message_of_size("e", size, tail=char))
    row = pair.up_rows.row("", "e")
    assert row is not None and row["content_chunks"] == 1
    char_start = size - closing - len(char.encode())
    expected = char_start if char_start + len(char.encode()) > BUDGET else BUDGET
    assert len(str(row["content"]).encode()) == expected, "upstream's cut moved: the case no longer straddles"
    pair.import_(_text_message_of_size("i", size, tail=char * 3), parent=None, created_at=1_600_000_000_000)


def test_escaped_lone_surrogate_at_the_cut(make_pair: Callable[..., Pair]) -> None:
    """A lone surrogate is stored as a 6-byte escape; it may be cut like any ASCII run."""
    pair = make_pair(level="light")
    base = _text_message_of_size("s", BUDGET - 2)
    text = base["parts"][0]["text"][:-4]
    raw = json.dumps({"id": "s", "role": "user", "parts": [{"type": "text", "text": text}]}, separators=(",", ":"))
    raw = raw[: -len('"}]}')] + '\\ud800\\udc00x\\udbff"}]}'
    pair.append(raw)
