"""`queries.ancestors`: a row and the rows up its parent pointers in one statement, over a real
store file, as the newest-first walk reads them."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessions_server.storage import queries, schema

MESSAGES = "cf_agents_session_messages"
CHUNKS = "cf_agents_session_message_chunks"


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    with contextlib.closing(sqlite3.connect(tmp_path / "store.sqlite")) as connection:
        connection.isolation_level = None
        schema.initialize(connection, "k")
        yield connection


def _add(conn: sqlite3.Connection, message_id: str, parent_id: str | None, content: str, session_id: str = "") -> None:
    seq = conn.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {MESSAGES}").fetchone()[0]
    conn.execute(
        f"INSERT INTO {MESSAGES} (session_id, id, seq, parent_id, role, content, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (session_id, message_id, seq, parent_id, "user", content, seq),
    )


def _chain(conn: sqlite3.Connection, count: int) -> None:
    """m0 (a root) ← m1 ← … ← m{count-1}."""
    for i in range(count):
        _add(conn, f"m{i}", f"m{i - 1}" if i else None, f'{{"id":"m{i}"}}')


def _ids(
    conn: sqlite3.Connection,
    start: str,
    count: int,
    session_id: str = "",
    max_bytes: int = 1 << 30,
    with_attachments: bool = False,
) -> list[str]:
    rows = queries.ancestors(conn, session_id, start, count, max_bytes, with_attachments=with_attachments)
    return [row.info.id for row in rows]


def test_rows_come_newest_first_and_stop_at_the_count(conn: sqlite3.Connection) -> None:
    _chain(conn, 10)
    assert _ids(conn, "m9", 4) == ["m9", "m8", "m7", "m6"]
    assert _ids(conn, "m5", 1) == ["m5"]
    assert _ids(conn, "m9", 0) == []


def test_the_chain_ends_at_a_root_or_a_missing_row(conn: sqlite3.Connection) -> None:
    _chain(conn, 3)
    assert _ids(conn, "m2", 10) == ["m2", "m1", "m0"]
    _add(conn, "orphan", "gone", '{"id":"orphan"}')
    _add(conn, "child", "orphan", '{"id":"child"}')
    assert _ids(conn, "child", 10) == ["child", "orphan"]
    assert _ids(conn, "nowhere", 10) == []


def test_the_walk_stays_in_its_session(conn: sqlite3.Connection) -> None:
    _add(conn, "a", None, "{}", session_id="s1")
    _add(conn, "b", "a", "{}", session_id="s2")  # its parent id names a row of another session
    assert _ids(conn, "b", 10, session_id="s2") == ["b"]
    assert _ids(conn, "b", 10, session_id="s1") == []


def test_a_cycle_is_bounded_by_the_count(conn: sqlite3.Connection) -> None:
    _add(conn, "x", "y", "{}")
    _add(conn, "y", "x", "{}")
    assert _ids(conn, "x", 5) == ["x", "y", "x", "y", "x"]


def test_rows_with_continuations_are_reassembled_and_carry_their_facts(conn: sqlite3.Connection) -> None:
    _chain(conn, 2)
    head, tail = '{"id":"big","text":"' + "é" * 10, "ü" * 10 + '"}'
    _add(conn, "big", "m1", head)
    conn.execute(f"UPDATE {MESSAGES} SET content_chunks = 1, token_estimate = 7 WHERE id = 'big'")
    conn.execute(f"INSERT INTO {CHUNKS} (session_id, id, idx, content) VALUES ('', 'big', 1, ?)", (tail,))
    rows = queries.ancestors(conn, "", "big", 3, 1 << 30, with_attachments=False)
    assert [row.content for row in rows] == [head + tail, '{"id":"m1"}', '{"id":"m0"}']
    assert rows[0].info == queries.get_message(conn, "", "big").info  # type: ignore[union-attr]
    assert (rows[0].info.parent_id, rows[0].info.token_estimate) == ("m1", 7)
    assert rows[2].info.parent_id is None


def test_a_read_stops_before_the_row_that_would_pass_the_byte_bound(conn: sqlite3.Connection) -> None:
    """Bytes as a read hydrates them: the first slice, continuations, and (when asked) the
    referenced attachment payloads at their base64 length. A first row larger than the bound
    comes alone."""
    for i in range(4):
        _add(conn, f"m{i}", f"m{i - 1}" if i else None, f'{{"id":"m{i}","t":"{"x" * 100}"}}')
    row = len('{"id":"m0","t":"' + "x" * 100 + '"}')
    assert _ids(conn, "m3", 10, max_bytes=3 * row) == ["m3", "m2", "m1"]
    assert _ids(conn, "m3", 10, max_bytes=3 * row - 1) == ["m3", "m2"]
    assert _ids(conn, "m3", 10, max_bytes=1) == ["m3"]

    head, tail = '{"id":"big","t":"' + "é" * 10, "ü" * 10 + '"}'
    _add(conn, "big", "m3", head)
    conn.execute(f"UPDATE {MESSAGES} SET content_chunks = 1 WHERE id = 'big'")
    conn.execute(f"INSERT INTO {CHUNKS} (session_id, id, idx, content) VALUES ('', 'big', 1, ?)", (tail,))
    big = len((head + tail).encode())
    assert _ids(conn, "big", 10, max_bytes=big + row) == ["big", "m3"]
    assert _ids(conn, "big", 10, max_bytes=big + row - 1) == ["big"]

    conn.execute("INSERT INTO cf_agents_session_attachment_meta VALUES ('h', 3000, 'image/png', 1)")
    conn.execute("INSERT INTO cf_agents_session_attachment_refs VALUES ('', 'm3', 'h')")
    payload = 4000  # 3,000 bytes in base64
    bound = big + row + payload + row
    assert _ids(conn, "big", 10, max_bytes=bound - 1) == ["big", "m3", "m2", "m1", "m0"]
    assert _ids(conn, "big", 10, max_bytes=bound - 1, with_attachments=True) == ["big", "m3"]
    assert _ids(conn, "big", 10, max_bytes=bound, with_attachments=True) == ["big", "m3", "m2"]
