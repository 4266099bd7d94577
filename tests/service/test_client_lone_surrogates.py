"""Message JSON text holding a lone UTF-16 surrogate (a Python str can; no UTF-8 request can
carry it) is refused by the Python client before anything is sent, as the TypeScript and Go
clients refuse it (INVALID_ARGUMENT, reason INVALID_JSON): on every write path it raised
protobuf's UnicodeEncodeError from inside the request's construction (client audit, session
52). Dicts holding one go with it escaped, as JSON allows (`to_json`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from sessions_client import ImportItem, SessionsError

LONE = '{"id":"m","role":"user","parts":[{"type":"text","text":"x\ud800"}]}'
LARGE = '{"id":"m","role":"user","parts":[{"type":"text","text":"' + "y" * 5_000_000 + '\ud800"}]}'

WRITES: dict[str, Callable[[Any, str], object]] = {
    "append": lambda session, text: session.append_message(text),
    "append large": lambda session, text: session.append_message(LARGE),
    "append batch": lambda session, text: session.append_messages([text]),
    "update": lambda session, text: session.update_message(text),
    "upsert": lambda session, text: session.upsert_message(text),
    "import": lambda session, text: session.import_messages([ImportItem(text, None)]),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_text_with_a_lone_surrogate_is_refused_before_sending(
    session: Any, write: Callable[[Any, str], object]
) -> None:
    with pytest.raises(SessionsError) as refused:
        write(session, LONE)
    assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_JSON")
    assert refused.value.message == (
        "message JSON holds a lone UTF-16 surrogate, which UTF-8 cannot carry; escape it as \\uXXXX"
    )
    assert session.get_history() == []


def test_a_dict_with_a_lone_surrogate_goes_escaped(session: Any) -> None:
    session.append_message({"id": "m", "role": "user", "parts": [{"type": "text", "text": "x\ud800"}]})
    assert session.get_message("m")["parts"][0]["text"] == "x\ud800"
