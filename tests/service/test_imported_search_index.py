"""An imported file's search index is checked against the texts it holds (FTS5's own check):
SQLite's integrity check passes an index whose rows went missing, and the object's first search
then found it damaged, after which every call on the object was refused (DATA_LOSS). The index
is derived from the messages, so one that disagrees is dropped and built again by the first
search, as for a file that never had one."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sessions_client.admin import export_file, import_file
from tests.service.support import text_message


def _fts_check(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        try:
            conn.execute("INSERT INTO cf_agents_session_fts (cf_agents_session_fts) VALUES ('integrity-check')")
        except sqlite3.DatabaseError as exc:
            return str(exc)
    return "ok"


@pytest.mark.parametrize("replace", [False, True], ids=["new", "replacing"])
def test_an_imported_file_whose_search_index_disagrees_is_served_and_searched(
    client: Any, tmp_path: Path, object_key: str, replace: bool
) -> None:
    session = client.object(object_key).session()
    for index in range(5):
        session.append_message(text_message(f"m{index}", f"hello world {index}"))
    assert len(session.search("hello")) == 5  # the index is built, and exported with the file
    path = tmp_path / "copy.sqlite"
    export_file(client, object_key, path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM cf_agents_session_fts_content")
    assert _fts_check(path) != "ok"

    target = object_key if replace else f"{object_key}-imported"
    import_file(client, target, path, replace=replace)
    copy = client.object(target).session()

    assert sorted(hit.id for hit in copy.search("hello")) == [f"m{index}" for index in range(5)]
    copy.append_message(text_message("m5", "hello again"))
    assert sorted(hit.id for hit in copy.search("again")) == ["m5"]
    assert [message["id"] for message in copy.get_history()] == [f"m{index}" for index in range(6)]
