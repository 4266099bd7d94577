"""A message that names one stored payload many times reads back with the payload at each place:
a write of a few KB of pointers to a 5 MB image read back as 400 MB (server peak 1.2 GB), and
nothing bounded how many. A write is refused when the message would read back, its payloads
inline, as more than one message may be (`--max-assembly-bytes`; `--max-client-message-bytes`
for a client's), and nothing of it is written."""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_server.domain.limits import Limits
from tests.conftest import LiveServer, start_server

PAYLOAD = random.Random(7).randbytes(300_000)  # 400,000 bytes in base64
POINTER = "attachment:sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
ASSEMBLY_BYTES = 8 * 1024 * 1024  # 20 uses of the payload fit, 21 do not
CLIENT_BYTES = 2 * 1024 * 1024  # 5 uses fit, 6 do not


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    limits = Limits(max_assembly_bytes=ASSEMBLY_BYTES, max_client_message_bytes=CLIENT_BYTES)
    live = start_server(tmp_path / "data", limits=limits)
    try:
        yield live
    finally:
        live.stop()


def _pointing(message_id: str, uses: int) -> dict[str, Any]:
    parts = [{"type": "file", "mediaType": "image/png", "url": POINTER} for _ in range(uses)]
    return {"id": message_id, "role": "user", "parts": parts}


def _with_image(session: Any) -> None:
    session.append_message({"id": "img", "role": "user", "parts": [_image_part()]})


def _image_part() -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(PAYLOAD).decode()
    return {"type": "file", "mediaType": "image/png", "url": url}


def test_pointers_to_a_stored_payload_are_counted_at_each_use(server: LiveServer) -> None:
    with SessionsClient(server.address, retry=None) as client:
        session = client.object("o").session()
        _with_image(session)
        session.append_message(_pointing("fits", 20))
        assert len(session.get_message("fits")["parts"]) == 20
        with pytest.raises(SessionsError) as refused:
            session.append_message(_pointing("past", 21))
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
        assert refused.value.metadata["limit"] == "max_assembly_bytes"
        assert session.get_message("past") is None
        with pytest.raises(SessionsError) as refused:
            session.update_message(_pointing("fits", 21))  # an update is held to it too
        assert refused.value.metadata["limit"] == "max_assembly_bytes"
        assert len(session.get_message("fits")["parts"]) == 20


def test_a_client_message_is_held_to_the_client_cap(server: LiveServer) -> None:
    with SessionsClient(server.address, retry=None) as client:
        session = client.object("o").session()
        _with_image(session)
        session.append_message(_pointing("fits", 5), source="client")
        with pytest.raises(SessionsError) as refused:
            session.append_message(_pointing("past", 6), source="client")
        assert refused.value.metadata["limit"] == "max_client_message_bytes"
        with pytest.raises(SessionsError) as batch:
            session.append_messages([_pointing("a", 1), _pointing("b", 6)], source="client")
        assert batch.value.message.startswith("message 'b' would read back as")  # which of the batch
        assert [m["id"] for m in session.get_history()] == ["img", "fits"]  # the batch wrote nothing


def test_an_import_is_held_to_it_too(server: LiveServer) -> None:
    with SessionsClient(server.address, retry=None) as client:
        session = client.object("o").session()
        _with_image(session)
        with pytest.raises(SessionsError) as refused:
            session.import_messages([_pointing("fits", 20), _pointing("past", 21)])
        assert refused.value.metadata["limit"] == "max_assembly_bytes"
        assert session.get_message("past") is None


def _expanding(message_id: str, sent_bytes: int) -> str:
    """A message whose numbers JSON.stringify writes about five times longer than they came:
    `1E20` (4 bytes) stores as 100000000000000000000 (21)."""
    count = sent_bytes // 5
    numbers = ",".join(["1E20"] * count)
    return f'{{"id":"{message_id}","role":"user","parts":[],"metadata":{{"n":[{numbers}]}}}}'


def test_a_message_is_held_to_its_cap_as_stored_not_as_sent(server: LiveServer) -> None:
    """The caps were checked on the text as it arrived: a client's 8 MiB message of such numbers
    was stored as 35 MiB past its 10 MiB cap, and one of 30 MiB as 132 MiB past a 64 MiB budget
    (large messages audit, session 49). Nothing of a refused write is stored; an import refuses
    such a message as any too large one, the messages before it kept."""
    with SessionsClient(server.address, retry=None) as client:
        session = client.object("o").session()
        fits = _expanding("fits", CLIENT_BYTES // 8)  # stored: about 5/8 of the cap
        session.append_message(fits, source="client")
        assert len(session.get_message("fits")["metadata"]["n"]) == CLIENT_BYTES // 8 // 5
        past_client_cap = _expanding("client", CLIENT_BYTES // 2)  # sent: half the cap; stored: 2.6x
        with pytest.raises(SessionsError) as refused:
            session.append_message(past_client_cap, source="client")
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
        assert refused.value.metadata["limit"] == "max_client_message_bytes"
        assert "as stored" in refused.value.message and "1E20" in refused.value.message
        with pytest.raises(SessionsError) as refused:
            session.upsert_message(past_client_cap, source="client")
        assert refused.value.metadata["limit"] == "max_client_message_bytes"
        past_budget = _expanding("server", ASSEMBLY_BYTES // 4)  # sent: a quarter of the budget
        with pytest.raises(SessionsError) as over:
            session.append_message(past_budget)
        assert over.value.metadata["limit"] == "max_assembly_bytes"
        with pytest.raises(SessionsError) as imported:
            session.import_messages([{"id": "before", "role": "user", "parts": []}, past_budget])
        assert imported.value.metadata["limit"] == "max_assembly_bytes"
        assert session.get_message("before") is not None and session.get_message("fits") is not None
        assert session.get_message("client") is None and session.get_message("server") is None


def test_a_payload_arriving_after_its_pointers_is_held_to_the_bound_of_the_messages_naming_it(
    server: LiveServer,
) -> None:
    """A pointer whose payload the object does not hold counted as nothing at its write: 21 uses
    of it went in, and the image written after them made that message read back past the bound
    (the audit's 80 MB from a 16 MiB bound; 48 MB in one client batch). The write bringing the
    payload is refused, naming the message it would grow, and writes nothing."""
    with SessionsClient(server.address, retry=None) as client:
        session = client.object("o").session()
        session.append_message(_pointing("many", 21))
        assert session.get_message("many")["parts"][0]["url"] == POINTER  # no payload: the pointer
        with pytest.raises(SessionsError) as refused:
            _with_image(session)
        assert (refused.value.code, refused.value.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
        assert refused.value.message.startswith(
            "message 'many' of session '' names an attachment the object did not hold, which message 'img' brings"
        )
        assert refused.value.metadata["limit"] == "max_assembly_bytes"
        assert session.get_message("img") is None
        assert client.object("o").get_object_stats().attachment_count == 0
        with pytest.raises(SessionsError) as batch:  # the pointers first in one client batch
            session.append_messages(
                [_pointing("few", 6), {"id": "img2", "role": "user", "parts": [_image_part()]}], source="client"
            )
        assert batch.value.metadata["limit"] == "max_client_message_bytes"
        assert "message 'few' of session ''" in batch.value.message
        assert [m["id"] for m in session.get_history()] == ["many"]
        session.delete_messages(["many"])
        _with_image(session)  # named by nothing now: stored
        assert session.get_message("img")["parts"][0]["url"].startswith("data:image/png;base64,")


def test_a_payload_named_within_the_bound_is_stored_and_read_inline_by_the_messages_naming_it(
    server: LiveServer,
) -> None:
    with SessionsClient(server.address, retry=None) as client:
        session = client.object("o").session()
        session.append_message(_pointing("some", 20))
        _with_image(session)
        assert all(part["url"] == _image_part()["url"] for part in session.get_message("some")["parts"])
