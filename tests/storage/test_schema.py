"""Files written by upstream open and serve here unchanged (DESIGN.md §1): the page size stays, the
rows read back, appends continue the seq; agents 0.23/0.24 files gain `content_hash` on open and
an identical update only stamps the digest (reference notes §1, §5)."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from sessions_server.storage import schema
from tests.service.support import js_json, message_rows, open_readonly, text_message
from tests.storage.upstream_schema import (
    SCHEMA_VERSION_1,
    SCHEMA_VERSION_KEY,
    UPSTREAM_DDL,
    normalized,
    object_file,
    write_upstream_store,
)


def upstream_rows() -> list[tuple[str, str, int, str | None, str, str, int]]:
    return [
        ("", "m1", 1, None, "user", js_json(text_message("m1", "hello")), 1_700_000_000_000),
        ("", "m2", 2, "m1", "assistant", js_json(text_message("m2", "world", role="assistant")), 1_700_000_000_001),
        ("", "m3", 3, "m1", "user", js_json(text_message("m3", "branch")), 1_700_000_000_002),
        ("other", "m1", 1, None, "user", js_json(text_message("m1", "other session")), 1_700_000_000_003),
    ]


def test_an_upstream_file_opens_and_serves(client: Any, live_server: Any, object_key: str) -> None:
    data_dir = Path(live_server.data_dir)
    path = object_file(data_dir, object_key)
    write_upstream_store(path, upstream_rows())
    session = client.object(object_key).session()

    assert session.get_history() == [text_message("m1", "hello"), text_message("m3", "branch")]
    assert [m["id"] for m in session.get_history(leaf_id="m2")] == ["m1", "m2"]
    assert session.get_latest_leaf() == text_message("m3", "branch")
    assert client.object(object_key).session("other").get_message("m1") == text_message("m1", "other session")
    result = session.append_message(text_message("m4", "next"))
    assert result.parent_id == "m3"
    assert [(r["id"], r["seq"]) for r in message_rows(data_dir, object_key)][-1] == ("m4", 4)

    with open_readonly(path) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096  # the file format is unchanged
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        ddl = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
        for name, expected in UPSTREAM_DDL.items():
            assert normalized(ddl[name]) == normalized(expected)
        version = conn.execute("SELECT value FROM _cf_KV WHERE key = ?", (SCHEMA_VERSION_KEY,)).fetchone()[0]
        assert version == SCHEMA_VERSION_1


def test_a_0_23_file_gains_content_hash_and_identical_update_stamps_it(
    client: Any, live_server: Any, object_key: str
) -> None:
    data_dir = Path(live_server.data_dir)
    path = object_file(data_dir, object_key)
    write_upstream_store(path, upstream_rows()[:3], with_content_hash=False)
    session = client.object(object_key).session()

    assert session.get_message("m2") == text_message("m2", "world", role="assistant")
    with open_readonly(path) as conn:
        columns = [r[1] for r in conn.execute("PRAGMA table_info('cf_agents_session_messages')")]
    assert columns[-1] == "content_hash"
    rows = {r["id"]: r for r in message_rows(data_dir, object_key)}
    assert rows["m2"]["content_hash"] is None

    # identical content: only the digest is stamped
    session.update_message(text_message("m2", "world", role="assistant"))
    row = {r["id"]: r for r in message_rows(data_dir, object_key)}["m2"]
    assert row["content"] == rows["m2"]["content"]
    assert row["content_hash"] == hashlib.sha256(row["content"].encode()).hexdigest()
    assert {k: v for k, v in row.items() if k != "content_hash"} == {
        k: v for k, v in rows["m2"].items() if k != "content_hash"
    }

    # a real change rewrites the row
    session.update_message(text_message("m3", "changed"))
    row = {r["id"]: r for r in message_rows(data_dir, object_key)}["m3"]
    assert row["content"] == js_json(text_message("m3", "changed"))
    assert row["content_hash"] == hashlib.sha256(row["content"].encode()).hexdigest()
    assert (row["seq"], row["parent_id"]) == (3, "m1")


def _file_of_an_older_server(
    path: Path, object_key: str, rows: list[tuple[Any, ...]], missing: str = "_sessions_messages_by_parent"
) -> None:
    """This service's own file from before the index `missing`: every other object."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        schema.initialize(conn, object_key)
        conn.execute(f"DROP INDEX {missing}")
        conn.executemany(
            """INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at)
               VALUES (?, ?, ?, ?, ?, ?, ?)""",
            rows,
        )


@pytest.mark.parametrize("made_by", ["upstream", "older server"])
def test_a_file_without_the_parent_index_gains_it_on_open_and_keeps_its_rows(
    client: Any, live_server: Any, object_key: str, made_by: str
) -> None:
    data_dir = Path(live_server.data_dir)
    path = object_file(data_dir, object_key)
    if made_by == "upstream":
        write_upstream_store(path, upstream_rows())
    else:
        _file_of_an_older_server(path, object_key, upstream_rows())
    with open_readonly(path) as conn:
        assert (
            conn.execute("SELECT 1 FROM sqlite_master WHERE name = '_sessions_messages_by_parent'").fetchone() is None
        )
    before = message_rows(data_dir, object_key, None)

    branches = client.object(object_key).session().get_branches("m1")  # the first call opens the file

    assert branches == [text_message("m2", "world", role="assistant"), text_message("m3", "branch")]
    assert message_rows(data_dir, object_key, None) == before
    with open_readonly(path) as conn:
        (ddl,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = '_sessions_messages_by_parent'"
        ).fetchone()
        assert normalized(ddl) == (
            "CREATE INDEX _sessions_messages_by_parent ON cf_agents_session_messages (session_id, parent_id, seq)"
        )
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert client.object(object_key).session().delete_messages(["m1"]) == 1
    assert [(r["id"], r["parent_id"]) for r in message_rows(data_dir, object_key)] == [("m2", None), ("m3", None)]


def test_a_file_without_the_attachment_reference_index_gains_it_on_open(
    client: Any, live_server: Any, object_key: str
) -> None:
    data_dir = Path(live_server.data_dir)
    path = object_file(data_dir, object_key)
    _file_of_an_older_server(path, object_key, upstream_rows(), missing="_sessions_attachment_refs_by_hash")
    before = message_rows(data_dir, object_key, None)
    assert client.object(object_key).session().get_message("m1") is not None  # the first call opens the file
    assert message_rows(data_dir, object_key, None) == before
    with open_readonly(path) as conn:
        (ddl,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = '_sessions_attachment_refs_by_hash'"
        ).fetchone()
        assert normalized(ddl) == (
            "CREATE INDEX _sessions_attachment_refs_by_hash ON cf_agents_session_attachment_refs (hash)"
        )
