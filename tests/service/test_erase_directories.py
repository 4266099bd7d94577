"""An erase through the server takes its object's emptied fan-out directories with it
(storage/paths.py `prune_object_directories`)."""

from __future__ import annotations

from pathlib import Path

from sessions_client import SessionsClient
from sessions_client.admin import erase_object
from sessions_server.storage.paths import OBJECTS_DIR, object_path
from tests.conftest import start_server
from tests.service.support import text_message


def test_an_erase_through_the_server_leaves_no_empty_directories(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            for index in range(20):
                client.object(f"erased-{index}").session().append_message(text_message("m1"))
            kept = client.object("kept").session()
            kept.append_message(text_message("m1"))
            for index in range(20):
                assert erase_object(client, f"erased-{index}")
            assert kept.get_history()[0]["id"] == "m1"
    finally:
        server.stop()
    objects = tmp_path / "data" / OBJECTS_DIR
    directories = [path for path in objects.rglob("*") if path.is_dir()]
    assert sorted(directories) == [
        object_path(tmp_path / "data", "kept").parent.parent,
        object_path(tmp_path / "data", "kept").parent,
    ]
