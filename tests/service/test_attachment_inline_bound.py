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
    url = "data:image/png;base64," + base64.b64encode(PAYLOAD).decode()
    session.append_message(
        {"id": "img", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": url}]}
    )


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
        with pytest.raises(SessionsError):
            session.update_message(_pointing("fits", 21))  # an update is held to it too
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
        with pytest.raises(SessionsError):
            session.upsert_message(past_client_cap, source="client")
        past_budget = _expanding("server", ASSEMBLY_BYTES // 4)  # sent: a quarter of the budget
        with pytest.raises(SessionsError) as over:
            session.append_message(past_budget)
        assert over.value.metadata["limit"] == "max_assembly_bytes"
        with pytest.raises(SessionsError) as imported:
            session.import_messages([{"id": "before", "role": "user", "parts": []}, past_budget])
        assert imported.value.metadata["limit"] == "max_assembly_bytes"
        assert session.get_message("before") is not None and session.get_message("fits") is not None
        assert session.get_message("client") is None and session.get_message("server") is None
