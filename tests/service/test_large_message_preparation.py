"""A large message is prepared (parsed, checked, sanitized, stamped, sliced) on a worker thread,
whatever the write: on the event loop, a 20 MB message of two million parts held every call to
every object for about 10 s."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessions_client import ImportItem, SessionHandle, SessionsClient
from sessions_server.domain import messages
from sessions_server.domain.messages import PREPARE_OFF_LOOP_CHARS
from tests.conftest import start_server


def _message(message_id: str, text: str = "x") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


LARGE_TEXT = "large " * (PREPARE_OFF_LOOP_CHARS // 5)

WRITES: dict[str, Callable[[SessionHandle], object]] = {
    "append": lambda s: s.append_message(_message("large", LARGE_TEXT)),
    "append a batch": lambda s: s.append_messages([_message("small"), _message("large", LARGE_TEXT)]),
    "update": lambda s: s.update_message(_message("m0", LARGE_TEXT)),
    "upsert": lambda s: s.upsert_message(_message("large", LARGE_TEXT)),
    "import": lambda s: s.import_messages([ImportItem(_message("large", LARGE_TEXT), parent_id=None)]),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_large_message_is_prepared_while_other_calls_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """The preparation of the large message is held until a call to another object has been
    answered, which it could not be if the preparation held the event loop."""
    held, release = threading.Event(), threading.Event()
    original_write, original_import = messages.prepare_for_write, messages.prepare_for_import

    def hold_if_large(message: dict[str, Any]) -> None:
        if len(str(message["parts"])) > PREPARE_OFF_LOOP_CHARS:
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
            worker = threading.Thread(target=lambda: done.append(WRITES[write](session)))
            worker.start()
            try:
                assert held.wait(timeout=60), "the large message was not prepared"
                assert other.get_object_stats().message_rows == 1
            finally:
                release.set()
                worker.join(timeout=60)
            assert done, "the write did not finish"
            stored = {m["id"]: m for m in session.get_history()}
            large = stored.get("m0" if write == "update" else "large")
            assert large is not None and large["parts"][0]["text"] == LARGE_TEXT
    finally:
        release.set()
        server.stop()
