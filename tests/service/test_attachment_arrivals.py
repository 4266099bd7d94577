"""Payloads that arrive after the messages naming them, and files whose attachment bookkeeping
upstream left incomplete (media audit, session 52).

A message may name an attachment its object does not hold (a pointer copied from another
object's read): it reads back as the pointer. Sending the bytes for it again, as the same
message with its media inline, was taken as no change (same stored form) and stored nothing,
while UpdateMessage answered with the media inline. Files imported from upstream before 0.32
lack the references of pointers their messages were written with, and upstream's duplicate
imports leave payloads no message names: the first lost a payload another message still named
when its one referencing message went, the second kept payloads for good."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sessions_client import SessionsClient
from sessions_client.admin import export_file, import_file
from tests.conftest import start_server
from tests.service.test_attachments import (
    assert_no_payloads,
    file_part,
    image_message,
    meta_rows,
    object_path,
    payload,
    pointer,
    refs,
    sha,
)


def _copied_pointer(data: bytes) -> dict[str, Any]:
    """A part as a pointer-mode read of another object returns it."""
    return {"type": "file", "mediaType": "image/png", "url": pointer(data)}


@pytest.mark.parametrize("how", ["update", "upsert", "append again"])
def test_bytes_sent_for_a_pointer_the_message_names_are_stored(
    session: Any, object_key: str, data_dir: Path, how: str
) -> None:
    data = payload(5000, 52)
    session.append_message(image_message("m", _copied_pointer(data)))
    assert session.get_message("m") == image_message("m", _copied_pointer(data))
    assert meta_rows(data_dir, object_key) == {}
    inline = image_message("m", file_part(data))
    if how == "update":
        assert session.update_message(inline) == inline
    elif how == "upsert":
        session.upsert_message(inline)
    else:
        session.append_message(inline)
    assert session.get_message("m") == inline
    assert set(meta_rows(data_dir, object_key)) == {sha(data)}
    assert refs(data_dir, object_key) == {("", "m", sha(data))}


def test_a_repeated_id_bringing_bytes_no_message_names_stores_none(
    session: Any, object_key: str, data_dir: Path
) -> None:
    session.append_message(image_message("m", text="no media"))
    session.append_message(image_message("m", file_part(payload(5000, 53))))  # the id is taken: ignored
    assert session.get_message("m") == image_message("m", text="no media")
    assert_no_payloads(data_dir, object_key)


def test_an_imported_file_gains_the_references_its_messages_name_and_loses_payloads_none_names(
    client: SessionsClient, object_key: str, data_dir: Path, tmp_path: Path
) -> None:
    data, orphan, stale = payload(4000, 54), payload(3000, 55), payload(2000, 57)
    session = client.object(object_key).session()
    session.append_message(image_message("holder", file_part(data)))
    session.append_message(image_message("copy", _copied_pointer(data)))
    exported = tmp_path / "object.sqlite"
    export_file(client, object_key, exported)
    with sqlite3.connect(exported) as conn:  # as upstream 0.24 and its duplicate imports leave a file
        conn.execute("DELETE FROM cf_agents_session_attachment_refs WHERE message_id = 'copy'")
        conn.execute(
            "INSERT INTO cf_agents_session_attachment_meta (hash, bytes, media_type, chunks) VALUES (?, ?, ?, 1)",
            (sha(orphan), len(orphan), "image/png"),
        )
        conn.execute(
            "INSERT INTO cf_agents_session_attachment_chunks (hash, idx, data) VALUES (?, 0, ?)", (sha(orphan), orphan)
        )
        # and one named only by a reference of a message long gone
        conn.execute(
            "INSERT INTO cf_agents_session_attachment_meta (hash, bytes, media_type, chunks) VALUES (?, ?, ?, 1)",
            (sha(stale), len(stale), "image/png"),
        )
        conn.execute(
            "INSERT INTO cf_agents_session_attachment_chunks (hash, idx, data) VALUES (?, 0, ?)", (sha(stale), stale)
        )
        conn.execute(
            "INSERT INTO cf_agents_session_attachment_refs (session_id, message_id, hash) VALUES ('', 'gone', ?)",
            (sha(stale),),
        )
    imported_key = object_key + "-imported"
    import_file(client, imported_key, exported)
    assert refs(data_dir, imported_key) == {("", "holder", sha(data)), ("", "copy", sha(data))}
    assert set(meta_rows(data_dir, imported_key)) == {sha(data)}
    imported = client.object(imported_key).session()
    imported.delete_messages(["holder"])
    assert imported.get_message("copy") == image_message("copy", file_part(data))


def test_an_object_an_older_server_kept_gains_the_references_its_messages_name_on_open(tmp_path: Path) -> None:
    """A file from before the reference index (an older server's, which may hold an upstream
    0.24 import short of references) has its references rebuilt as it is upgraded on open: the
    import's rebuild alone left objects already in a data directory losing the bytes a message
    named when the one message holding a reference went (review, session 52)."""
    data = payload(4000, 56)
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("legacy").session()
            session.append_message(image_message("holder", file_part(data)))
            session.append_message(image_message("copy", _copied_pointer(data)))
    finally:
        server.stop()
    with contextlib.closing(sqlite3.connect(object_path(tmp_path / "data", "legacy"))) as conn, conn:
        conn.execute("DELETE FROM cf_agents_session_attachment_refs WHERE message_id = 'copy'")
        conn.execute("DROP INDEX _sessions_attachment_refs_by_hash")
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("legacy").session()
            session.delete_messages(["holder"])
            assert session.get_message("copy") == image_message("copy", file_part(data))
        assert refs(tmp_path / "data", "legacy") == {("", "copy", sha(data))}
    finally:
        server.stop()
