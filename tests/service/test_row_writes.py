"""Row-write accounting (issue 5): `GetObjectStats.row_writes` counts rows written as upstream's
storage billing counts them (reference notes §4 "Cost", §12 "Billed rows"). Each test measures
the delta one operation adds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessions_client import SessionsClient
from tests.conftest import start_server
from tests.service.support import text_message
from tests.service.test_attachments import file_part, image_message, payload


def writes(session: Any, operation: Callable[[], Any]) -> int:
    before = session.object.get_object_stats().row_writes
    operation()
    return int(session.object.get_object_stats().row_writes - before)


def test_text_append_writes_one_row(session: Any):
    assert writes(session, lambda: session.append_message(text_message("m1", "hello"))) == 1
    assert writes(session, lambda: session.append_message(text_message("m2", "again"))) == 1


def test_twenty_text_appends_write_twenty_rows(session: Any):
    def run() -> None:
        for index in range(20):
            session.append_message(text_message(f"m{index}", f"turn {index}"))

    assert writes(session, run) == 20


def test_a_batch_writes_a_row_per_new_message_and_a_retried_batch_none(session: Any):
    batch = [text_message(f"m{index}", f"turn {index}") for index in range(5)]
    assert writes(session, lambda: session.append_messages(batch)) == 5
    assert writes(session, lambda: session.append_messages(batch)) == 0
    partly_stored = [text_message("n1"), text_message("m0"), text_message("n2")]
    assert writes(session, lambda: session.append_messages(partly_stored)) == 2


def test_200_kib_image_append_writes_four_rows(session: Any):
    # message row, one payload chunk, payload meta, reference
    message = image_message("img", file_part(payload(200 * 1024, 1)))
    assert writes(session, lambda: session.append_message(message)) == 4


def test_2_mib_image_append_writes_five_rows(session: Any):
    # message row, two payload chunks, payload meta, reference
    message = image_message("img", file_part(payload(2 * 1024 * 1024, 2)))
    assert writes(session, lambda: session.append_message(message)) == 5


def test_known_payload_append_writes_message_and_reference_only(session: Any):
    data = payload(200 * 1024, 3)
    session.append_message(image_message("a", file_part(data)))
    assert writes(session, lambda: session.append_message(image_message("b", file_part(data)))) == 2


def test_unchanged_update_writes_nothing(session: Any):
    message = text_message("m1", "hello")
    session.append_message(message)
    assert writes(session, lambda: session.update_message(message)) == 0
    image = image_message("img", file_part(payload(200 * 1024, 4)))
    session.append_message(image)
    assert writes(session, lambda: session.update_message(image)) == 0


def test_changed_text_update_writes_one_row(session: Any):
    session.append_message(text_message("m1", "hello"))
    assert writes(session, lambda: session.update_message(text_message("m1", "hello, changed"))) == 1


def test_duplicate_append_writes_nothing(session: Any):
    session.append_message(text_message("m1", "hello"))
    assert writes(session, lambda: session.append_message(text_message("m1", "other"))) == 0


def test_overlay_id_append_writes_nothing(session: Any):
    session.append_message(text_message("m1", "hello"))
    assert writes(session, lambda: session.append_message(text_message("compaction_x", "echo"))) == 0


def test_row_writes_survive_a_restart(tmp_path: Path):
    """GetObjectStats documents row writes "since the object was created by this service"."""
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            session = client.object("counted").session()
            session.append_message(text_message("m1", "hello"))
            session.append_message(image_message("img", file_part(payload(1000, 5))))
            assert client.object("counted").get_object_stats().row_writes == 5
    finally:
        server.stop()
    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            assert client.object("counted").get_object_stats().row_writes == 5
            client.object("counted").session().append_message(text_message("m2", "again"))
            assert client.object("counted").get_object_stats().row_writes == 6
    finally:
        server.stop()


# Deletes and clears bill every row they write, as upstream's do: they counted the message rows
# alone (session audit 52: a 20-row prefix billed 19, a clear of 3 messages and 2 compactions 3).


def test_deleting_a_twenty_row_prefix_writes_twenty_rows(session: Any):
    # 19 deletes and the surviving child re-parented (reference notes §4 "Cost")
    for index in range(20):
        session.append_message(text_message(f"c{index:02}", f"turn {index}"))
    assert writes(session, lambda: session.delete_messages([f"c{index:02}" for index in range(19)])) == 20


def test_deleting_a_row_with_children_writes_each_child_re_parented(session: Any):
    session.append_message(text_message("a", "root"))
    session.append_message(text_message("c", "middle"))
    session.append_message(text_message("d", "first child"), parent_id="c")
    session.append_message(text_message("e", "second child"), parent_id="c")
    assert writes(session, lambda: session.delete_messages(["c"])) == 3


def test_deleting_a_large_message_writes_its_continuations(session: Any):
    session.append_message(text_message("big", "x" * (2 * 1024 * 1024)))  # a row and a continuation
    assert writes(session, lambda: session.delete_messages(["big"])) == 2


def test_deleting_the_last_message_naming_a_payload_writes_the_payload_rows(session: Any):
    session.append_message(image_message("img", file_part(payload(200 * 1024, 6))))
    # message row, reference, payload meta and its one chunk
    assert writes(session, lambda: session.delete_messages(["img"])) == 4


def test_clearing_writes_messages_and_compactions(session: Any):
    for index in range(3):
        session.append_message(text_message(f"m{index}", f"turn {index}"))
    session.add_compaction("a summary", "m0", "m1")
    session.add_compaction("another", "m1", "m2")
    assert writes(session, session.clear_messages) == 5


def test_an_update_that_shrinks_a_message_writes_the_continuations_it_drops(session: Any):
    session.append_message(text_message("big", "x" * (4 * 1024 * 1024)))  # a row and two continuations
    assert writes(session, lambda: session.update_message(text_message("big", "tiny"))) == 3


def test_bytes_sent_again_for_a_pointer_the_message_names_write_the_payload_rows(session: Any):
    data = payload(1000, 7)
    copied = {"type": "file", "mediaType": "image/png", "url": "attachment:sha256:" + hashlib.sha256(data).hexdigest()}
    session.append_message(image_message("img", copied))  # a pointer-mode read of another object
    # the payload's one chunk and its meta; the message and its reference stand
    assert writes(session, lambda: session.append_message(image_message("img", file_part(data)))) == 2
