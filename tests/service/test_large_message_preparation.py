"""A large message, or one of many JSON values, is prepared (parsed, checked, sanitized, stamped,
sliced) on a worker thread, whatever the write: on the event loop, a 20 MB message of two million
parts held every call to every object for about 10 s, and a 256 KiB one of arrays nested 900
deep 83 ms."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessions_client import ImportItem, SessionHandle, SessionsClient
from sessions_server.domain import messages
from sessions_server.domain.messages import PREPARE_OFF_LOOP_CHARS, PREPARE_OFF_LOOP_VALUES
from tests.conftest import start_server


def _message(message_id: str, text: str = "x", metadata: object = None) -> dict[str, Any]:
    message: dict[str, Any] = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
    if metadata is not None:
        message["metadata"] = metadata
    return message


LARGE_TEXT = "large " * (PREPARE_OFF_LOOP_CHARS // 5)
# Under the size bound (some 8 KiB) but past the bound in values.
MANY_VALUES = {"values": [[] for _ in range(PREPARE_OFF_LOOP_VALUES)]}
COSTLY: dict[str, dict[str, Any]] = {
    "large": {"text": LARGE_TEXT},
    "many values": {"metadata": MANY_VALUES},
}
HELD_TEXT = "held"  # marks the costly message's part when it is not the large text

WRITES: dict[str, Callable[[SessionHandle, dict[str, Any]], object]] = {
    "append": lambda s, costly: s.append_message(_message("costly", **costly)),
    "append a batch": lambda s, costly: s.append_messages([_message("small"), _message("costly", **costly)]),
    "update": lambda s, costly: s.update_message(_message("m0", **costly)),
    "upsert": lambda s, costly: s.upsert_message(_message("costly", **costly)),
    "import": lambda s, costly: s.import_messages([ImportItem(_message("costly", **costly), parent_id=None)]),
}


@pytest.mark.parametrize("shape", list(COSTLY))
@pytest.mark.parametrize("write", list(WRITES))
def test_a_costly_message_is_prepared_while_other_calls_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: str, shape: str
) -> None:
    """The preparation of the costly message is held until a call to another object has been
    answered, which it could not be if the preparation held the event loop."""
    held, release = threading.Event(), threading.Event()
    original_write, original_import = messages.prepare_for_write, messages.prepare_for_import
    costly = dict(COSTLY[shape])
    costly.setdefault("text", HELD_TEXT)
    assert len(str(_message("costly", **costly))) < PREPARE_OFF_LOOP_CHARS or shape == "large"

    def hold_if_large(message: dict[str, Any]) -> None:
        if message["parts"][0]["text"] == costly["text"]:
            held.set()
            assert release.wait(timeout=60), "the preparation was never released"

    def write_held(message: dict[str, Any], **options: Any) -> messages.PreparedMessage:
        hold_if_large(message)
        return original_write(message, **options)

    def import_held(message: dict[str, Any], **options: Any) -> messages.PreparedMessage:
        hold_if_large(message)
        return original_import(message, **options)

    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client:
            session = client.object("writes").session()
            session.append_message(_message("m0"))
            other = client.object("other")
            other.session().append_message(_message("o1"))
            monkeypatch.setattr(messages, "prepare_for_write", write_held)
            monkeypatch.setattr(messages, "prepare_for_import", import_held)
            done: list[object] = []
            worker = threading.Thread(target=lambda: done.append(WRITES[write](session, costly)))
            worker.start()
            try:
                assert held.wait(timeout=60), "the large message was not prepared"
                assert other.get_object_stats().message_rows == 1
            finally:
                release.set()
                worker.join(timeout=60)
            assert done, "the write did not finish"
            stored = {m["id"]: m for m in session.get_history()}
            written = stored.get("m0" if write == "update" else "costly")
            assert written is not None and written["parts"][0]["text"] == costly["text"]
            assert written.get("metadata") == costly.get("metadata")
    finally:
        release.set()
        server.stop()


def test_a_small_message_of_many_values_does_not_wait_for_a_large_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages of many values are prepared in turn on a thread of their own, large messages
    elsewhere: one of a few KB waited seconds behind another tenant's 20 MB message."""
    held, release = threading.Event(), threading.Event()
    original = messages.prepare_for_write

    def hold_large(message: dict[str, Any], **options: Any) -> messages.PreparedMessage:
        if message["parts"][0]["text"] == LARGE_TEXT:
            held.set()
            assert release.wait(timeout=60), "the preparation was never released"
        return original(message, **options)

    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address, retry=None) as client:
            monkeypatch.setattr(messages, "prepare_for_write", hold_large)
            large = threading.Thread(
                target=lambda: client.object("large").session().append_message(_message("l", LARGE_TEXT))
            )
            large.start()
            try:
                assert held.wait(timeout=60), "the large message was not prepared"
                small = client.object("small").session()
                small.append_message(_message("s", HELD_TEXT, MANY_VALUES))
                assert [m["id"] for m in small.get_history()] == ["s"]
                assert large.is_alive()  # still held: the small one did not wait for it
            finally:
                release.set()
                large.join(timeout=60)
            assert [m["id"] for m in client.object("large").session().get_history()] == ["l"]
    finally:
        release.set()
        server.stop()
