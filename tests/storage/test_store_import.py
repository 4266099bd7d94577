"""Importing a store file (import-store, ImportObject): a file holding a text past a limit is
refused whole, naming the row and the limit, and nothing is installed; reads could not carry it.
A digest stamp that does not match its row is cleared."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import files, schema
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from tests.storage.upstream_schema import write_upstream_store

MESSAGES = "cf_agents_session_messages"
COMPACTIONS = "cf_agents_session_compactions"
CONFIG = "cf_agents_session_config"
MEDIA = "cf_agents_session_attachment_meta"
LIMIT = 100
PAYLOAD = b"\x89"  # an attachment's bytes: a file's attachments must match their hashes

# Every (table, column) a limit can cover, with a row whose text goes in that column.
COLUMNS = [
    (MESSAGES, "session_id"),
    (MESSAGES, "id"),
    (MESSAGES, "parent_id"),
    (MESSAGES, "role"),
    (COMPACTIONS, "session_id"),
    (COMPACTIONS, "id"),
    (COMPACTIONS, "from_message_id"),
    (COMPACTIONS, "to_message_id"),
    (COMPACTIONS, "summary"),
    (CONFIG, "session_id"),
    (MEDIA, "media_type"),
]


def _store(path: Path, table: str, column: str, text: object) -> Path:
    """A store holding ordinary rows in every table, and `text` in `column` of one row of `table`."""
    rows = {
        MESSAGES: {
            "session_id": "s",
            "id": "m1",
            "seq": 1,
            "parent_id": "m0",
            "role": "user",
            # It names the attachment: an import drops payloads no message names.
            "content": '{"id":"m1","role":"user","parts":[{"type":"file","mediaType":"image/png",'
            f'"url":"attachment:sha256:{hashlib.sha256(PAYLOAD).hexdigest()}"}}]}}',
            "created_at": 1,
        },
        COMPACTIONS: {
            "session_id": "s",
            "id": "c1",
            "seq": 1,
            "summary": "short",
            "from_message_id": "m0",
            "to_message_id": "m1",
            "created_at": 1,
        },
        CONFIG: {"session_id": "s", "key": "compaction_policy", "value": "{}"},
        MEDIA: {"hash": hashlib.sha256(PAYLOAD).hexdigest(), "bytes": 1, "media_type": "image/png", "chunks": 1},
    }
    rows[table][column] = text
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.isolation_level = None
        schema.initialize(conn, "origin")
        conn.execute(  # a second, ordinary message first: the scan must go past it
            f"INSERT INTO {MESSAGES} (session_id, id, seq, role, content, created_at)"
            " VALUES ('s', 'm0', 0, 'user', '{}', 1)"
        )
        for name, row in rows.items():
            conn.execute(
                f"INSERT INTO {name} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
            )
        conn.execute(
            "INSERT INTO cf_agents_session_attachment_chunks (hash, idx, data) VALUES (?, 0, ?)",
            (rows[MEDIA]["hash"], PAYLOAD),
        )
    return path


def _limits(max_bytes: int = LIMIT) -> list[files.TextLimit]:
    return [files.TextLimit(table, column, max_bytes, f"max_{column}") for table, column in COLUMNS]


def _leftovers(data_dir: Path) -> list[Path]:
    return [p for p in data_dir.rglob("*") if p.is_file()]


@pytest.mark.parametrize(("table", "column"), COLUMNS)
def test_a_text_one_byte_past_its_limit_is_refused_and_nothing_installed(
    tmp_path: Path, table: str, column: str
) -> None:
    source = _store(tmp_path / "source.sqlite", table, column, "x" * (LIMIT + 1))
    before = source.read_bytes()
    data_dir = tmp_path / "data"
    with pytest.raises(files.OversizedText) as refused:
        files.import_store_file(source, "k", data_dir, text_limits=_limits())
    assert refused.value.limit == files.TextLimit(table, column, LIMIT, f"max_{column}")
    assert f"its {column} is {LIMIT + 1} bytes; the limit is {LIMIT} bytes (max_{column})" in str(refused.value)
    assert _leftovers(data_dir) == []  # no object, no partial copy
    assert source.read_bytes() == before


MISTYPED = [
    (MESSAGES, "seq", b"\x01", "the message with session_id 's', id 'm1': its seq holds a blob value", "integer"),
    (
        MESSAGES,
        "created_at",
        "x",
        "the message with session_id 's', id 'm1': its created_at holds a text value",
        "integer",
    ),
    (MESSAGES, "content", b"{}", "the message with session_id 's', id 'm1': its content holds a blob value", "text"),
    (
        COMPACTIONS,
        "created_at",
        "yesterday",
        "the compaction with session_id 's', id 'c1': its created_at holds a text value",
        "integer",
    ),
    (
        MEDIA,
        "bytes",
        "many",
        f"the attachment with hash '{hashlib.sha256(PAYLOAD).hexdigest()}': its bytes holds a text value",
        "integer",
    ),
]


@pytest.mark.parametrize(("table", "column", "value", "row", "declared"), MISTYPED)
def test_a_value_of_another_kind_than_its_column_is_refused_and_nothing_installed(
    tmp_path: Path, table: str, column: str, value: object, row: str, declared: str
) -> None:
    """SQLite checks no column types: a compaction whose created_at was 'yesterday' imported, and
    then every read of its session failed INTERNAL (a ValueError); chunk data stored as a number
    read as that many zero bytes."""
    source = _store(tmp_path / "source.sqlite", table, column, value)
    data_dir = tmp_path / "data"
    with pytest.raises(files.MistypedValue) as refused:
        files.import_store_file(source, "k", data_dir, text_limits=_limits())
    assert str(refused.value) == f"{row}, where its column declares {declared}"
    assert _leftovers(data_dir) == []


@pytest.mark.parametrize(
    ("table", "column"), [(MESSAGES, "created_at"), (MESSAGES, "seq"), (COMPACTIONS, "created_at")]
)
def test_a_fraction_in_an_integer_column_is_imported(tmp_path: Path, table: str, column: str) -> None:
    """Upstream's importMessage stores `createdAt: 1700000000000.5` as a REAL (SQLite keeps a
    fraction so): such a file is upstream's own, and served (reads take the integer part)."""
    source = _store(tmp_path / "source.sqlite", table, column, 1_700_000_000_000.5)
    target = files.import_store_file(source, "k", tmp_path / "data", text_limits=_limits())
    assert target.exists()


@pytest.mark.parametrize(("table", "column"), COLUMNS)
def test_a_text_at_its_limit_is_imported(tmp_path: Path, table: str, column: str) -> None:
    source = _store(tmp_path / "source.sqlite", table, column, "x" * LIMIT)
    target = files.import_store_file(source, "k", tmp_path / "data", text_limits=_limits())
    assert target == object_path(tmp_path / "data", "k")
    with contextlib.closing(sqlite3.connect(target)) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?", ("x" * LIMIT,)).fetchone() == (1,)


def test_texts_are_measured_in_utf8_bytes(tmp_path: Path) -> None:
    role = "é" * 51  # 51 characters, 102 bytes
    source = _store(tmp_path / "source.sqlite", MESSAGES, "role", role)
    with pytest.raises(files.OversizedText, match="its role is 102 bytes"):
        files.import_store_file(source, "k", tmp_path / "data", text_limits=_limits())


def test_the_row_is_named_with_its_key_cut_short(tmp_path: Path) -> None:
    source = _store(tmp_path / "source.sqlite", MESSAGES, "id", "i" * 5_000)
    with pytest.raises(files.OversizedText) as refused:
        files.import_store_file(source, "k", tmp_path / "data", text_limits=_limits())
    message = str(refused.value)
    assert message.startswith(f"the message with session_id 's', id '{'i' * 64}… (5000 characters)'")
    assert len(message) < 300


def test_a_refused_replacement_keeps_the_object_it_would_replace(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = files.import_store_file(
        _store(tmp_path / "ok.sqlite", MESSAGES, "role", "user"), "k", data_dir, text_limits=_limits()
    )
    kept = first.read_bytes()
    bad = _store(tmp_path / "bad.sqlite", COMPACTIONS, "summary", "s" * 1_000)
    with pytest.raises(files.OversizedText):
        files.import_store_file(bad, "k", data_dir, replace=True, text_limits=_limits())
    assert first.read_bytes() == kept
    assert _leftovers(data_dir) == [first]


def test_a_replacement_cut_short_before_its_rename_keeps_the_old_object_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between removing the old object and installing the new one lost both (the copy
    waited in scratch, which the next start empties). Where the pages cannot go in place (see
    the next test), the swap is one rename now: before it, the old object is whole, its commits
    still in its WAL moved into the file first."""
    data_dir = tmp_path / "data"
    target = files.import_store_file(_store(tmp_path / "old.sqlite", MESSAGES, "role", "user"), "k", data_dir)
    before = target.read_bytes()
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(f"UPDATE {MESSAGES} SET content = '{{\"late\":1}}' WHERE id = 'm0'")
        conn.commit()
        wal = Path(str(target) + "-wal").read_bytes()
    # As a crash leaves it: the commit in the WAL only (closing had checkpointed it).
    target.write_bytes(before)
    Path(str(target) + "-wal").write_bytes(wal)
    new = _store(tmp_path / "new.sqlite", MESSAGES, "role", "assistant")

    def crash(self: Path, destination: Path) -> Path:
        raise OSError("the process died here")

    monkeypatch.setattr(files, "_replace_in_place", lambda staged, target: False)  # another page size, say
    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(OSError, match="died"):
        files.import_store_file(new, "k", data_dir, replace=True)
    monkeypatch.undo()

    with contextlib.closing(sqlite3.connect(f"file:{target}?mode=ro", uri=True)) as conn:
        assert conn.execute(f"SELECT content FROM {MESSAGES} WHERE id = 'm0'").fetchone() == ('{"late":1}',)
        assert conn.execute(f"SELECT role FROM {MESSAGES} WHERE id = 'm1'").fetchone() == ("user",)


def test_a_replacement_goes_into_the_file_in_place_while_a_replicator_reads_it(tmp_path: Path) -> None:
    """Litestream keeps each object's file open with a read transaction on it. The replacement's
    checkpoint waited on that transaction for good (refused: "in use elsewhere"), and had it got
    through, the rename would have left the replicator reading the old inode's database with the
    new file's WAL, its replica of the object corrupt. The new pages now go into the same file,
    as one commit in its WAL, which the reader leaves alone and a replicator copies as any."""
    data_dir = tmp_path / "data"
    target = files.import_store_file(_store(tmp_path / "old.sqlite", MESSAGES, "role", "user"), "k", data_dir)
    inode = target.stat().st_ino
    with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as replicator:
        replicator.execute("BEGIN")
        assert replicator.execute(f"SELECT role FROM {MESSAGES} WHERE id = 'm1'").fetchone() == ("user",)
        new = _store(tmp_path / "new.sqlite", MESSAGES, "role", "assistant")
        assert files.import_store_file(new, "k", data_dir, replace=True) == target
        # The reader's snapshot is unchanged until it ends; the file is the same one.
        assert replicator.execute(f"SELECT role FROM {MESSAGES} WHERE id = 'm1'").fetchone() == ("user",)
        replicator.execute("COMMIT")
        assert replicator.execute(f"SELECT role FROM {MESSAGES} WHERE id = 'm1'").fetchone() == ("assistant",)
    assert target.stat().st_ino == inode
    with contextlib.closing(sqlite3.connect(f"file:{target}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert not list((data_dir / "scratch").iterdir())


def test_without_limits_any_text_is_imported(tmp_path: Path) -> None:
    source = _store(tmp_path / "source.sqlite", MESSAGES, "role", "r" * 10_000)
    assert files.import_store_file(source, "k", tmp_path / "data").exists()


def test_an_import_and_a_removal_sync_the_directories_their_names_live_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A power cut cannot be simulated here; what can be checked is that the directories whose
    # entries changed were synced (fsync passes through: the spy only records).
    synced: list[Path] = []
    real_fsync = files.os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(Path(files.os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", recording_fsync)
    data_dir = tmp_path / "data"
    source = _store(tmp_path / "source.sqlite", MESSAGES, "role", "user")
    target = files.import_store_file(source, "k", data_dir)
    assert synced == [target.parent, target.parent.parent, target.parent.parent.parent, data_dir]
    synced.clear()
    assert files.remove_object_files(target)
    assert synced == [target.parent]


def test_a_corrupt_store_is_refused_and_nothing_installed(tmp_path: Path) -> None:
    source = tmp_path / "source.sqlite"
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.isolation_level = None
        schema.initialize(conn, "origin")
        content = '{"id":"m","role":"user","parts":[{"type":"text","text":"' + "x" * 500 + '"}]}'
        conn.executemany(
            f"INSERT INTO {MESSAGES} (session_id, id, seq, role, content, created_at) VALUES ('', ?, ?, 'user', ?, 1)",
            [(f"m{i:05d}", i, content) for i in range(2_000)],
        )
    size = source.stat().st_size
    with source.open("r+b") as damaged:  # pages the copy carries over as they are
        damaged.seek(size // 2)
        damaged.write(bytes(range(256)) * 12)
    with pytest.raises(files.StoreImportError, match=r"malformed|integrity check failed"):
        files.import_store_file(source, "k", tmp_path / "data")
    assert _leftovers(tmp_path / "data") == []


def test_a_stamp_that_does_not_match_its_row_is_cleared_and_the_row_checked_on_read(tmp_path: Path) -> None:
    """Reads trust a stamped row to hold the JSON its digest was taken of. A file whose stamp
    vouches for other content (here a row damaged after it was written) has that stamp cleared on
    import, so reads check the row and skip it, as upstream does with JSON that does not parse;
    rows whose stamps match, a message in continuation rows included, keep theirs."""
    large = '{"id":"big","role":"user","parts":[{"type":"text","text":"' + "é" * 1_000_000 + '"}]}'

    source = _origin(tmp_path, [_message("m0"), large, _message("m2")])
    with contextlib.closing(sqlite3.connect(source)) as conn:
        stamps = dict(conn.execute(f"SELECT id, content_hash FROM {MESSAGES}"))
        chunks = conn.execute(f"SELECT content_chunks FROM {MESSAGES} WHERE id = 'big'").fetchone()[0]
        conn.execute(f'UPDATE {MESSAGES} SET content = \'{{"id":"m2","ro\' WHERE id = \'m2\'')
        conn.commit()
    assert chunks >= 1 and all(stamps.values())

    target = files.import_store_file(source, "k", tmp_path / "data")
    with contextlib.closing(sqlite3.connect(target)) as conn:
        after = dict(conn.execute(f"SELECT id, content_hash FROM {MESSAGES}"))
    assert after == {**stamps, "m2": None}

    async def read_imported() -> list[str]:
        service = SessionsService(ObjectRegistry(tmp_path / "data", ThreadPoolExecutor(max_workers=2)))
        try:
            return [row.info.id async for window in service.history("k", "") for row in window if row.info]
        finally:
            await service.registry.close_all()

    assert asyncio.run(read_imported()) == ["m0", "big"]


def _origin(tmp_path: Path, texts: list[str]) -> Path:
    """A store written by this service (`origin`, one chain of `texts`), closed: its file."""

    async def write() -> None:
        service = SessionsService(ObjectRegistry(tmp_path / "origin", ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append_many("origin", "", [AppendInput(text, Parent.auto(), False) for text in texts])
        finally:
            await service.registry.close_all()

    asyncio.run(write())
    return object_path(tmp_path / "origin", "origin")


def _message(message_id: str) -> str:
    return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"hello"}}]}}'


def _object_with_a_row_in_its_wal(tmp_path: Path, value: str) -> tuple[Path, Path]:
    """An object file whose one row (`value` in table t) is in its WAL only, as a crash leaves
    it; and the set-aside directory."""
    path = object_path(tmp_path / "data", "k")
    path.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE t (v TEXT)")
        conn.execute("INSERT INTO t VALUES (?)", (value,))
        conn.commit()
        wal = Path(str(path) + "-wal").read_bytes()
        before = path.read_bytes()
    path.write_bytes(before)  # the closing connection checkpointed: put the file back as it was
    Path(str(path) + "-wal").write_bytes(wal)
    return path, tmp_path / "data" / "set-aside"


@pytest.mark.parametrize("clock", ["running", "frozen"])
def test_an_object_set_aside_twice_keeps_both_copies_each_with_its_own_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: str
) -> None:
    """Set aside under its own name, the second copy overwrote the first, and an earlier copy's
    WAL stayed beside a later file without one: opening it read the earlier rows. The name was
    the clock's nanoseconds alone, which a clock that stands still or was set back repeats (a
    clock audit)."""
    if clock == "frozen":
        monkeypatch.setattr(files.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    path, aside = _object_with_a_row_in_its_wal(tmp_path, "first")
    first = files.set_object_files_aside(path, aside)
    with contextlib.closing(sqlite3.connect(path)) as conn:  # the key's second file: no WAL left
        conn.execute("CREATE TABLE t (v TEXT)")
        conn.execute("INSERT INTO t VALUES ('second')")
        conn.commit()
    second = files.set_object_files_aside(path, aside)

    assert first is not None and second is not None and first != second
    for copy, expected in ((first, "first"), (second, "second")):
        with contextlib.closing(sqlite3.connect(f"file:{copy}?mode=ro", uri=True)) as conn:
            assert conn.execute("SELECT v FROM t").fetchall() == [(expected,)]


def test_a_set_aside_cut_short_between_its_renames_keeps_the_wals_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the WAL was moved and before the file was left the file without its
    latest commits; the next start set it aside under another name, parted from them."""
    path, aside = _object_with_a_row_in_its_wal(tmp_path, "in the wal")

    replace = Path.replace

    def dying_replace(self: Path, target: Any) -> Path:
        if self == path:
            raise OSError("the process dies before the file is moved")
        return replace(self, target)

    monkeypatch.setattr(Path, "replace", dying_replace)
    with pytest.raises(OSError, match="dies"):
        files.set_object_files_aside(path, aside)
    monkeypatch.setattr(Path, "replace", replace)
    moved = files.set_object_files_aside(path, aside)  # the next start

    assert moved is not None and not path.exists()
    with contextlib.closing(sqlite3.connect(f"file:{moved}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT v FROM t").fetchall() == [("in the wal",)]


def test_a_stamped_row_that_is_not_a_message_is_unstamped_and_skipped_as_upstream_skips_it(tmp_path: Path) -> None:
    """Upstream's importMessage stamps whatever it was given: a file of its can hold stamped
    rows (the digest right) that its own reads skip. Reads here trusted the stamp and served them
    (`"parts": ""`, a numeric role), and a row nested past what reads parse that named an
    attachment failed every read of its path (INTERNAL). On import such a row loses its stamp;
    reads then check it, and skip it; and a read skips a row it cannot parse, stamped or not."""
    pointer = "attachment:sha256:" + "a" * 64
    deep = "[" * 1_010 + "1" + "]" * 1_010  # within what orjson takes, past what reads parse
    not_messages = {
        "m1": '{"id":"m1","role":"user","parts":""}',
        "m2": '{"id":"m2","role":5,"parts":[]}',
        "m3": '{"id":"m3","role":"user","parts":[{"type":"file","url":"' + pointer + '"}],"deep":' + deep + "}",
    }

    source = _origin(tmp_path, [_message(f"m{index}") for index in range(5)])
    with contextlib.closing(sqlite3.connect(source)) as conn:
        for message_id, content in not_messages.items():
            digest = hashlib.sha256(content.encode()).hexdigest()
            conn.execute(
                f"UPDATE {MESSAGES} SET content = ?, content_hash = ? WHERE id = ?", (content, digest, message_id)
            )
        conn.commit()

    target = files.import_store_file(source, "k", tmp_path / "data")
    with contextlib.closing(sqlite3.connect(target)) as conn:
        stamped = {row[0] for row in conn.execute(f"SELECT id FROM {MESSAGES} WHERE content_hash IS NOT NULL")}
    assert stamped == {"m0", "m3", "m4"}  # m3 is a message to the import's check: reads skip it

    async def read_imported() -> tuple[list[str], list[str], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path / "data", ThreadPoolExecutor(max_workers=2)))
        try:
            forward = [view.info.id async for window in service.history("k", "") for view in window if view.info]
            newest = [
                view.info.id
                async for window in service.history("k", "", newest_first=True)
                for view in window
                if view.info
            ]
            found = [
                message_id
                for message_id in ("m0", "m1", "m2", "m3", "m4")
                if await service.get_message("k", "", message_id) is not None
            ]
            return forward, newest, found
        finally:
            await service.registry.close_all()

    assert asyncio.run(read_imported()) == (["m0", "m4"], ["m4", "m0"], ["m0", "m4"])


@pytest.mark.parametrize("name", ["good?copy.sqlite", "a#b.sqlite", "50%25.sqlite"])
def test_a_file_whose_name_holds_uri_characters_is_read_as_itself(tmp_path: Path, name: str) -> None:
    """Files were opened as `file:{path}?mode=ro` URIs: a `?` or `#` ended the path, and SQLite
    created an empty database at what came before, which was imported (0 messages, reported as
    done) in place of the file named. A data directory holding one listed no objects."""
    source = _store(tmp_path / name, MESSAGES, "role", "user")
    data_dir = tmp_path / "data#1?"
    target = files.import_store_file(source, "k", data_dir)
    assert files.count_message_rows(target) == 2
    assert files.recorded_object_key(target) == "k"
    snapshot = files.snapshot_object(target, data_dir / "scratch", 0)
    assert files.count_message_rows(snapshot) == 2
    strays = [p.name for p in tmp_path.iterdir() if p != data_dir and not p.name.startswith(name)]
    assert strays == []  # no database made at a path cut short


def test_an_upstream_store_of_4_kib_pages_is_installed_with_the_servers_pages_and_replaces_in_place(
    tmp_path: Path,
) -> None:
    """An imported file of another page size stopped Litestream replicating its object for good
    ("unaligned wal offset" on every sync), and one at the same path after an erase (Litestream
    audit, session 52); and it replaced an object by renaming the file. Imports now take the
    server's 16 KiB pages: the object's file keeps its inode when replaced again."""
    rows = [
        ("", f"m{i}", i, f"m{i - 1}" if i else None, "user", f'{{"id":"m{i}","role":"user","parts":[]}}', i)
        for i in range(50)
    ]
    upstream = tmp_path / "upstream.sqlite"
    write_upstream_store(upstream, rows, page_size=4096)
    data_dir = tmp_path / "data"
    target = files.import_store_file(upstream, "k", data_dir)
    with contextlib.closing(sqlite3.connect(target)) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == schema.NEW_FILE_PAGE_SIZE
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = conn.execute("SELECT id, content FROM cf_agents_session_messages ORDER BY seq").fetchall()
    assert stored == [(row[1], row[5]) for row in rows]
    inode = target.stat().st_ino
    assert files.import_store_file(upstream, "k", data_dir, replace=True) == target
    assert target.stat().st_ino == inode  # its pages written in place, through SQLite
