"""The format of this service's own files (`schema.FILE_FORMAT`, recorded in `_sessions_meta`): a
file records it from its first open by a server that knows formats, and a server refuses a file
of a newer format (NewerFileFormat) before anything is written to it, rather than misread it.

An upgrade audit found nothing in a file that grew with the service's own format: a server from
before attachments were stored by hash opened a current file without a word and served the stored
`attachment:sha256:` pointers as the messages' media. Such old servers cannot be fixed; from
format 1 on, a rollback past a format change is refused instead."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from sessions_server.storage import files, import_checks, schema
from sessions_server.storage.paths import object_path
from sessions_server.storage.rows import NewerFileFormat, ObjectDamaged
from tests.storage.test_registry_opens import registry
from tests.storage.upstream_schema import SCHEMA_VERSION_1, SCHEMA_VERSION_KEY, write_upstream_store

KEY = "formats"
ROWS = [
    ("", f"m{i}", i, f"m{i - 1}" if i > 1 else None, "user", f'{{"id":"m{i}","role":"user","parts":[]}}', i)
    for i in range(1, 4)
]


def _server_file(path: Path, object_key: str = KEY) -> Path:
    """A file as this server writes it: initialized (its format recorded), three messages, WAL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        schema.initialize(conn, object_key)
        conn.executemany(
            "INSERT INTO cf_agents_session_messages (session_id, id, seq, parent_id, role, content, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            ROWS,
        )
    return path


def _set_format(path: Path, value: str | None) -> None:
    """Records `value` as the file's format (None: no record, as a server before formats left it)."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DELETE FROM _sessions_meta WHERE key = 'format'")
        if value is not None:
            conn.execute("INSERT INTO _sessions_meta (key, value) VALUES ('format', ?)", (value,))


def _recorded(path: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return dict(conn.execute("SELECT key, value FROM _sessions_meta WHERE key IN ('format', 'object_key')"))


def _rows(path: Path) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT * FROM cf_agents_session_messages ORDER BY session_id, seq").fetchall()


def _message_ids(conn: sqlite3.Connection) -> list[str]:
    return [str(row[0]) for row in conn.execute("SELECT id FROM cf_agents_session_messages ORDER BY seq")]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_ready(path: Path) -> bool:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        return schema.is_ready(conn, KEY)


def _initialize(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        schema.initialize(conn, KEY)


def _assert_names_the_formats(exc: BaseException) -> None:
    assert isinstance(exc, NewerFileFormat) and not isinstance(exc, ObjectDamaged)
    assert (exc.recorded, exc.known) == ("2", schema.FILE_FORMAT)
    assert str(exc) == (
        "the file is in format 2 of this service's files, newer than the 1 this server knows: "
        "run a server at least as new as the one that wrote it"
    )


def test_a_new_file_records_this_servers_format_beside_upstreams_version(tmp_path: Path) -> None:
    path = _server_file(tmp_path / "new.sqlite")

    assert _recorded(path) == {"object_key": KEY, "format": "1"}
    assert schema.FILE_FORMAT == 1
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        kv = dict(conn.execute("SELECT key, value FROM _cf_KV"))
    assert kv == {SCHEMA_VERSION_KEY: SCHEMA_VERSION_1}  # upstream's own version is left as upstream writes it
    assert _is_ready(path)


def _older_servers_file(path: Path) -> None:
    _server_file(path)
    _set_format(path, None)


def _upstreams_file(path: Path) -> None:
    write_upstream_store(path, ROWS)


def _format_0_file(path: Path) -> None:
    _server_file(path)
    _set_format(path, "0")


@pytest.mark.parametrize(
    "make",
    [_older_servers_file, _upstreams_file, _format_0_file],
    ids=["a server's from before formats", "upstream's", "format 0"],
)
def test_a_file_without_this_format_is_not_ready_and_gains_it_in_the_upgrade(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    """Such files take the open's upgrade transaction once (not the fast path), which records the
    format; their rows stay as they were, and the next open is the fast path again."""
    path = tmp_path / "old.sqlite"
    make(path)
    rows = _rows(path)

    assert not _is_ready(path)
    _initialize(path)

    assert _recorded(path) == {"object_key": KEY, "format": "1"}
    assert _rows(path) == rows
    assert _is_ready(path)


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_file_of_a_newer_format_is_refused_on_open_and_left_byte_for_byte(tmp_path: Path, journal: str) -> None:
    """A WAL file is refused by the fast path's check (`is_ready`), a file in another journal
    mode (an export's copy) by `initialize` before it switches the file to WAL, which writes."""
    path = _server_file(tmp_path / "newer.sqlite")
    _set_format(path, "2")
    if journal == "delete":
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode = DELETE")
    before = _digest(path)

    if journal == "wal":
        with pytest.raises(NewerFileFormat) as fast:
            _is_ready(path)
        _assert_names_the_formats(fast.value)
    else:
        assert not _is_ready(path)
    with pytest.raises(NewerFileFormat) as full:
        _initialize(path)
    _assert_names_the_formats(full.value)

    assert _digest(path) == before
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    assert _recorded(path) == {"object_key": KEY, "format": "2"}


@pytest.mark.parametrize("in_place", [True, False], ids=["opened in place", "opened on the executor"])
def test_the_registry_refuses_a_newer_format_without_quarantining_the_object(tmp_path: Path, in_place: bool) -> None:
    """The file is fine, the server too old for it: it is not damage. Once the file is one the
    server knows, the next call opens it, without a restart."""
    path = _server_file(object_path(tmp_path, KEY))
    _set_format(path, "2")
    before = _digest(path)

    async def scenario() -> list[str]:
        async with registry(tmp_path, (lambda: 1) if in_place else None) as objects:
            for _ in range(2):
                with pytest.raises(NewerFileFormat) as refused:
                    async with objects.use(KEY):
                        pass
                _assert_names_the_formats(refused.value)
                assert objects.damage(KEY) is None
            assert _digest(path) == before
            _set_format(path, "1")
            async with objects.use(KEY) as store:
                return await store.read(_message_ids)

    assert asyncio.run(scenario()) == ["m1", "m2", "m3"]


@pytest.mark.parametrize(
    ("value", "format_number"),
    [(None, 0), ("0", 0), ("1", 1), ("01", 1)],
)
def test_format_records_this_server_knows(value: str | None, format_number: int) -> None:
    assert schema.file_format(value) == format_number


@pytest.mark.parametrize("value", ["2", "10", "3000000000", "9" * 5000, "", "-1", "1.0", " 1", "one", "١"])
def test_format_records_this_server_does_not_know_are_refused(value: str) -> None:
    """A newer format, and records no server writes (refused rather than guessed at)."""
    with pytest.raises(NewerFileFormat) as refused:
        schema.file_format(value)
    assert refused.value.recorded == value
    assert len(str(refused.value)) < 300  # a long record is cut short in the message


def test_an_import_of_a_newer_format_is_refused_before_the_object_it_would_replace_is_touched(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    target = files.import_store_file(_server_file(tmp_path / "first.sqlite"), KEY, data_dir)
    kept = _digest(target)
    source = _server_file(tmp_path / "newer.sqlite", "elsewhere")
    _set_format(source, "2")

    with (
        contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as conn,
        pytest.raises(import_checks.UnsafeFile) as unsafe,
    ):
        import_checks.check_schema(conn)
    with pytest.raises(files.StoreImportError) as refused:
        files.import_store_file(source, KEY, data_dir, replace=True)

    expected = (
        "holds format 2 of this service's files, newer than the 1 this server knows: "
        "bring it into a server at least as new as the one that wrote it"
    )
    assert str(unsafe.value) == expected
    assert str(refused.value) == f"{source} {expected}"
    assert _digest(target) == kept
    assert not [p for p in (data_dir / "scratch").iterdir()]  # the staged copy went too


def test_an_imported_file_without_the_record_gains_it(tmp_path: Path) -> None:
    source = _server_file(tmp_path / "source.sqlite", "elsewhere")
    _set_format(source, None)

    target = files.import_store_file(source, KEY, tmp_path / "data")

    assert _recorded(target) == {"object_key": KEY, "format": "1"}
    assert _rows(target) == _rows(source)
