"""A file brought in from elsewhere (ImportObject, import-store) carries nothing the service
would run on its behalf, and attachments that are what their rows say (a security audit's
findings): a trigger imported with the file ran inside every later append, on the server's
write threads with no deadline (one append: 22 s of every other tenant's writes, or 200 MB
written past the object's size limit); a view was run by the legacy lift; and a message naming
one stored payload 200 times read back as 800 MB, which the write calls refuse."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from sessions_server.storage import files, schema

MESSAGES_COLUMNS = """session_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, parent_id TEXT,
    type TEXT NOT NULL DEFAULT 'message', role TEXT NOT NULL, content TEXT NOT NULL,
    content_chunks INTEGER NOT NULL DEFAULT 0, token_estimate INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL, content_hash TEXT"""


def _store(path: Path, before: str = "", after: str = "") -> Path:
    """A store with one message; `before` runs before the service's schema is made (so a table
    it defines stays as it defined it), `after` once the schema is there."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.isolation_level = None
        if before:
            conn.executescript(before)
        schema.initialize(conn, "origin")
        conn.execute(
            "INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at)"
            """ VALUES ('', 'm1', 1, 'user', '{"id":"m1","role":"user","parts":[]}', 1)"""
        )
        if after:
            conn.executescript(after)
    return path


def _file_parts_pointers(text: str) -> list[str]:
    """The hashes a read restores, for these tests' messages: each file part's `url` pointer."""
    prefix = "attachment:sha256:"
    parts = json.loads(text).get("parts", [])
    return [p["url"][len(prefix) :] for p in parts if p.get("type") == "file" and p["url"].startswith(prefix)]


def _import(source: Path, data_dir: Path, max_read_back_bytes: int = 0) -> Path:
    read_back = files.ReadBack(max_read_back_bytes, _file_parts_pointers) if max_read_back_bytes else None
    return files.import_store_file(source, "k", data_dir, read_back=read_back)


def _nothing_installed(data_dir: Path) -> bool:
    return not [p for p in data_dir.rglob("*") if p.is_file()]


REFUSED_SCHEMAS = {
    "a trigger": (
        "",
        "CREATE TRIGGER evil AFTER INSERT ON cf_agents_session_messages BEGIN SELECT 1; END;",
        "holds a trigger ('evil'); a store holds none",
    ),
    "a view the legacy lift reads": (
        "",
        "CREATE VIEW assistant_messages AS SELECT 1 AS id;",
        "holds a view ('assistant_messages'); a store holds none",
    ),
    "a generated column in another table": (
        "",
        "CREATE TABLE notes (a INTEGER, b INTEGER GENERATED ALWAYS AS (a * 2) VIRTUAL);",
        "holds a table 'notes' with a generated column; a store has none",
    ),
    "a default the service does not write": (
        "CREATE TABLE cf_agents_session_messages ("
        + MESSAGES_COLUMNS.replace(" DEFAULT 0,", " DEFAULT (zeroblob(10)),", 1)
        + ", PRIMARY KEY (session_id, id)) WITHOUT ROWID;",
        "",
        "holds a table 'cf_agents_session_messages' that gives 'content_chunks' a default this service does not",
    ),
    "a column the service does not define": (
        f"CREATE TABLE cf_agents_session_messages ({MESSAGES_COLUMNS}, evil BLOB DEFAULT (zeroblob(10)),"
        " PRIMARY KEY (session_id, id)) WITHOUT ROWID;",
        "",
        "holds a table 'cf_agents_session_messages' with a column 'evil' this service does not define",
    ),
    "a check constraint": (
        f"CREATE TABLE cf_agents_session_messages ({MESSAGES_COLUMNS}, CHECK (length(content) < 1000000),"
        " PRIMARY KEY (session_id, id)) WITHOUT ROWID;",
        "",
        "holds a table 'cf_agents_session_messages' with a CHECK constraint this service does not define",
    ),
    "a key the service does not define": (
        f"CREATE TABLE cf_agents_session_messages ({MESSAGES_COLUMNS}, UNIQUE (session_id, role),"
        " PRIMARY KEY (session_id, id)) WITHOUT ROWID;",
        "",
        "holds a table 'cf_agents_session_messages' with keys this service does not define",
    ),
    "a column declared otherwise": (
        "CREATE TABLE cf_agents_session_messages ("
        + MESSAGES_COLUMNS.replace("role TEXT NOT NULL", "role TEXT", 1)
        + ", PRIMARY KEY (session_id, id)) WITHOUT ROWID;",
        "",
        "holds a table 'cf_agents_session_messages' whose column 'role' is not declared as this service does",
    ),
    "a collation": (
        "CREATE TABLE cf_agents_session_messages ("
        + MESSAGES_COLUMNS.replace("id TEXT NOT NULL,", "id TEXT NOT NULL COLLATE NOCASE,", 1)
        + ", PRIMARY KEY (session_id, id)) WITHOUT ROWID;",
        "",
        "holds a table 'cf_agents_session_messages' with keys this service does not define",
    ),
    "a collation of a column that is no key": (
        "CREATE TABLE cf_agents_session_messages ("
        + MESSAGES_COLUMNS.replace("role TEXT NOT NULL", "role TEXT NOT NULL COLLATE NOCASE", 1)
        + ", PRIMARY KEY (session_id, id)) WITHOUT ROWID;",
        "",
        "holds a table 'cf_agents_session_messages' with a collation this service does not define",
    ),
    "an index the service does not define": (
        "",
        "CREATE INDEX evil ON cf_agents_session_messages (length(content));",
        "holds an index 'evil' on 'cf_agents_session_messages' this service does not define",
    ),
    "an index under the service's name but another definition": (
        "",
        "DROP INDEX _sessions_messages_by_seq;"
        " CREATE INDEX _sessions_messages_by_seq ON cf_agents_session_messages (session_id, seq)"
        " WHERE length(content) > 0;",
        "holds an index '_sessions_messages_by_seq' on 'cf_agents_session_messages' this service does not define",
    ),
    "another search index": (
        "",
        "CREATE VIRTUAL TABLE cf_agents_session_fts USING fts5(id UNINDEXED, session_id UNINDEXED,"
        " role UNINDEXED, content, tokenize='trigram');",
        "holds a table 'cf_agents_session_fts' that is not the search index this service defines",
    ),
    "a search index as a plain table": (
        "",
        "CREATE TABLE cf_agents_session_fts (id, session_id, role, content);",
        "holds a table 'cf_agents_session_fts' not of the kind this service defines",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_SCHEMAS))
def test_a_schema_the_service_did_not_write_is_refused_and_nothing_installed(tmp_path: Path, case: str) -> None:
    before, after, reason = REFUSED_SCHEMAS[case]
    source = _store(tmp_path / "source.sqlite", before, after)
    data_dir = tmp_path / "data"
    with pytest.raises(files.StoreImportError) as refused:
        _import(source, data_dir)
    assert str(refused.value) == f"{source} {reason}"
    assert _nothing_installed(data_dir)


def test_another_applications_tables_come_along(tmp_path: Path) -> None:
    """An agent's whole database holds tables of its own, with CHECK constraints, partial
    indexes and search indexes (upstream's agents make such): the service never runs them, and
    takes the file with them."""
    source = _store(
        tmp_path / "source.sqlite",
        after="""CREATE TABLE cf_agents_tasks (id TEXT, state TEXT NOT NULL CHECK (state IN ('a', 'b')));
            INSERT INTO cf_agents_tasks VALUES ('t', 'a');
            CREATE INDEX cf_agents_tasks_open ON cf_agents_tasks (state) WHERE id IS NOT NULL;
            CREATE VIRTUAL TABLE cf_agents_search_fts USING fts5(label UNINDEXED, content);""",
    )
    target = _import(source, tmp_path / "data")
    with contextlib.closing(files.open_read_only(target)) as conn:
        assert conn.execute("SELECT id FROM cf_agents_session_messages").fetchall() == [("m1",)]
        assert conn.execute("SELECT id, state FROM cf_agents_tasks").fetchall() == [("t", "a")]


def _with_payload(data: bytes, *, size: int | None = None, digest: str | None = None, chunks: int = 1) -> str:
    digest = digest or hashlib.sha256(data).hexdigest()
    rows = "".join(
        f"INSERT INTO cf_agents_session_attachment_chunks VALUES ('{digest}', {i}, x'{data[i::chunks].hex()}');"
        for i in range(chunks)
    )
    recorded = len(data) if size is None else size
    return rows + f"INSERT INTO cf_agents_session_attachment_meta VALUES ('{digest}', {recorded}, 'image/png', 1);"


MISMATCHED: dict[str, tuple[Callable[[bytes], str], str]] = {
    "a size that is not its bytes'": (
        lambda data: _with_payload(data, size=1),
        "recorded as 1 bytes in 1 chunks; its chunks hold 3000 in 1",
    ),
    "bytes of another hash": (
        lambda data: _with_payload(data, digest=hashlib.sha256(b"other").hexdigest()),
        "with bytes of another hash",
    ),
    "a chunk count that is not its chunks'": (
        lambda data: _with_payload(data, chunks=2),
        "recorded as 3000 bytes in 1 chunks; its chunks hold 3000 in 2",
    ),
    "a hash that is no SHA-256": (
        lambda data: _with_payload(data, digest="not-a-hash"),
        "holds an attachment whose hash 'not-a-hash' is not a SHA-256 in hex",
    ),
}


@pytest.mark.parametrize("case", sorted(MISMATCHED))
def test_an_attachment_that_is_not_what_its_rows_say_is_refused(tmp_path: Path, case: str) -> None:
    """Reads trust an attachment's recorded size to budget their work, and its hash to share it
    with every later message naming the same bytes."""
    make, reason = MISMATCHED[case]
    source = _store(tmp_path / "source.sqlite", after=make(bytes(range(200)) * 15))
    data_dir = tmp_path / "data"
    with pytest.raises(files.StoreImportError) as refused:
        _import(source, data_dir)
    assert reason in str(refused.value)
    assert _nothing_installed(data_dir)


def _message_naming(digest: str, times: int) -> str:
    part = {"type": "file", "mediaType": "image/png", "url": f"attachment:sha256:{digest}"}
    return json.dumps({"id": "big", "role": "user", "parts": [part] * times})


def _store_naming(path: Path, data: bytes, times: int, *, cut: int | None = None) -> Path:
    """A store whose message `big` names one payload `times` times; with `cut`, its JSON goes in
    two rows, the second from character `cut` on."""
    digest = hashlib.sha256(data).hexdigest()
    text = _message_naming(digest, times)
    source = _store(path, after=_with_payload(data))
    with contextlib.closing(sqlite3.connect(source)) as conn:
        head, rest = (text, "") if cut is None else (text[:cut], text[cut:])
        conn.execute(
            "INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, content_chunks, created_at)"
            " VALUES ('', 'big', 2, 'user', ?, ?, 1)",
            (head, 1 if rest else 0),
        )
        if rest:
            conn.execute("INSERT INTO cf_agents_session_message_chunks VALUES ('', 'big', 1, ?)", (rest,))
        conn.commit()
    return source


def test_a_message_that_reads_back_past_the_assembly_limit_is_refused(tmp_path: Path) -> None:
    data = bytes(range(256)) * 12  # 3,072 bytes: 4,096 in base64
    times = 20
    text_bytes = len(_message_naming(hashlib.sha256(data).hexdigest(), times))
    read_back = text_bytes + times * 4_096
    source = _store_naming(tmp_path / "source.sqlite", data, times)
    data_dir = tmp_path / "data"
    with pytest.raises(files.OversizedText) as refused:
        _import(source, data_dir, max_read_back_bytes=read_back - 1)
    assert str(refused.value) == (
        f"the message with session_id '', id 'big': its JSON with its attachments inline is {read_back} bytes; "
        f"the limit is {read_back - 1} bytes (max_assembly_bytes)"
    )
    assert refused.value.limit.name == "max_assembly_bytes"
    assert _nothing_installed(data_dir)
    assert _import(source, tmp_path / "other", max_read_back_bytes=read_back).exists()


@pytest.mark.parametrize("cut_into", ["the prefix", "the hash"])
def test_a_pointer_cut_between_two_rows_is_counted(tmp_path: Path, cut_into: str) -> None:
    """A message's JSON is cut into rows anywhere: a pointer across the cut still names its payload."""
    data = bytes(range(256)) * 12
    digest = hashlib.sha256(data).hexdigest()
    times = 1
    text = _message_naming(digest, times)
    cut = text.index("attachment:sha256:") + 5 if cut_into == "the prefix" else text.index(digest) + 10
    source = _store_naming(tmp_path / "source.sqlite", data, times, cut=cut)
    with pytest.raises(files.OversizedText):
        _import(source, tmp_path / "data", max_read_back_bytes=len(text) + 4_095)
    assert _import(source, tmp_path / "other", max_read_back_bytes=len(text) + 4_096).exists()


def test_sqlites_message_about_a_file_is_cut_short(tmp_path: Path) -> None:
    """SQLite's errors quote the file's names, which run to any length (a table of 20,000
    characters whose schema is malformed): the refusal quotes 500 characters of SQLite's."""
    name = "c" * 20_000
    source = _store(
        tmp_path / "source.sqlite",
        after=f"CREATE TABLE {name} (a);"
        "PRAGMA writable_schema = ON;"
        f" UPDATE sqlite_master SET sql = 'CREATE TABLE {name} (' WHERE name = '{name}';",
    )
    data_dir = tmp_path / "data"
    with pytest.raises(files.StoreImportError) as refused:
        _import(source, data_dir)
    message = str(refused.value)
    assert "malformed database schema" in message
    assert len(message) < len(str(source)) + 600
    assert _nothing_installed(data_dir)


def test_a_pointers_text_where_no_read_restores_it_is_not_counted(tmp_path: Path) -> None:
    """A text part may quote a pointer: reads restore only a record's `url` or `data`, and the
    write calls count only those. Counting every pointer's text refused, on import, objects the
    server had stored (a move of one failed: a review's finding)."""
    data = bytes(range(256)) * 12
    digest = hashlib.sha256(data).hexdigest()
    quoted = {"type": "text", "text": f"see attachment:sha256:{digest} " * 50}
    text = json.dumps({"id": "quoting", "role": "user", "parts": [quoted]})
    source = _store(tmp_path / "source.sqlite", after=_with_payload(data))
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute(
            "INSERT INTO cf_agents_session_messages (session_id, id, seq, role, content, created_at)"
            " VALUES ('', 'quoting', 2, 'user', ?, 1)",
            (text,),
        )
        conn.commit()
    assert _import(source, tmp_path / "data", max_read_back_bytes=len(text) + 1).exists()
