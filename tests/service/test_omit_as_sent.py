"""`omit_json_as_sent`: a write leaves out JSON the caller already holds, and only that.

Without the flag every write answers its stored JSON inline (grpcurl users see it). With it, a
message stored byte for byte as sent comes back as `json_omitted` and `json_as_sent` with its
info; one the server changed (sanitized, re-serialized), or a taken id holding other JSON, still
comes back whole, so a client never mistakes its own JSON for the stored form.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import js_json, text_message


def _sanitized(message_id: str) -> tuple[str, str]:
    """JSON carrying OpenAI's ephemeral item id, and the JSON the server stores for it."""
    stored = text_message(message_id, "reply", role="assistant")
    sent = {**stored, "parts": [{**stored["parts"][0], "providerMetadata": {"openai": {"itemId": "item_1"}}}]}
    return js_json(sent), js_json(stored)


def _omitted_as_sent(written: pb.WrittenMessage, message_id: str) -> bool:
    assert written.info.id == message_id  # the row's facts always travel
    return written.json_omitted and written.json_as_sent and written.json == ""


def test_an_append_stored_as_sent_leaves_its_json_out_only_when_asked(stub: Any, object_key: str) -> None:
    text = js_json(text_message("a"))
    asked = stub.AppendMessage(
        pb.AppendMessageRequest(object_key=object_key, message_json=text, omit_json_as_sent=True)
    )
    assert asked.inserted and _omitted_as_sent(asked.message, "a")
    assert asked.message.info.seq == 1

    plain = stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=js_json(text_message("b"))))
    assert (plain.message.json, plain.message.json_omitted) == (js_json(text_message("b")), False)

    # The omitted JSON is stored all the same.
    read = stub.GetMessage(pb.GetMessageRequest(object_key=object_key, message_id="a"))
    assert "".join(response.frame.json for response in read) == text


def test_a_message_the_server_changed_comes_back_whole_even_when_asked(stub: Any, object_key: str) -> None:
    sent, stored = _sanitized("s")
    changed = stub.AppendMessage(
        pb.AppendMessageRequest(object_key=object_key, message_json=sent, omit_json_as_sent=True)
    )
    assert (changed.message.json, changed.message.json_omitted, changed.message.json_as_sent) == (stored, False, False)

    spaced = json.dumps(text_message("w"), indent=1)  # re-serialized compactly: not as sent
    reformatted = stub.AppendMessage(
        pb.AppendMessageRequest(object_key=object_key, message_json=spaced, omit_json_as_sent=True)
    )
    assert (reformatted.message.json, reformatted.message.json_omitted) == (js_json(text_message("w")), False)


def test_a_taken_id_answers_the_stored_message_whole_unless_it_is_what_was_sent(stub: Any, object_key: str) -> None:
    first = js_json(text_message("t", "first"))
    stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=first))

    def append(text: str) -> pb.AppendMessageResponse:
        request = pb.AppendMessageRequest(object_key=object_key, message_json=text, omit_json_as_sent=True)
        return stub.AppendMessage(request)

    other = append(js_json(text_message("t", "second")))
    assert (other.inserted, other.message.json, other.message.json_omitted) == (False, first, False)
    same = append(first)
    assert not same.inserted and _omitted_as_sent(same.message, "t")


def test_a_batch_leaves_out_each_item_stored_as_sent(stub: Any, object_key: str) -> None:
    sent, stored = _sanitized("s")
    texts = [js_json(text_message("a")), sent, js_json(text_message("b"))]
    response = stub.AppendMessages(
        pb.AppendMessagesRequest(
            object_key=object_key, items=[pb.AppendItem(message_json=t) for t in texts], omit_json_as_sent=True
        )
    )
    a, s, b = (result.message for result in response.results)
    assert _omitted_as_sent(a, "a") and _omitted_as_sent(b, "b")
    assert (s.json, s.json_omitted) == (stored, False)
    assert [result.message.info.seq for result in response.results] == [1, 2, 3]

    plain = stub.AppendMessages(
        pb.AppendMessagesRequest(object_key=object_key, items=[pb.AppendItem(message_json=js_json(text_message("c")))])
    )
    assert plain.results[0].message.json == js_json(text_message("c"))


def test_updates_and_upserts_leave_out_json_stored_as_sent_when_asked(stub: Any, object_key: str) -> None:
    stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=js_json(text_message("u"))))
    new = js_json(text_message("u", "changed"))
    updated = stub.UpdateMessage(
        pb.UpdateMessageRequest(object_key=object_key, message_json=new, omit_json_as_sent=True)
    )
    assert (updated.found, updated.changed) == (True, True) and _omitted_as_sent(updated.message, "u")
    plain = stub.UpdateMessage(pb.UpdateMessageRequest(object_key=object_key, message_json=new))
    assert (plain.changed, plain.message.json) == (False, new)

    upserted = stub.UpsertMessage(
        pb.UpsertMessageRequest(object_key=object_key, message_json=js_json(text_message("v")), omit_json_as_sent=True)
    )
    assert upserted.inserted and _omitted_as_sent(upserted.message, "v")
    sent, stored = _sanitized("v")
    sanitized = stub.UpsertMessage(
        pb.UpsertMessageRequest(object_key=object_key, message_json=sent, omit_json_as_sent=True)
    )
    assert (sanitized.inserted, sanitized.changed, sanitized.message.json) == (False, True, stored)


def test_the_flag_changes_no_error(stub: Any, object_key: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json="{", omit_json_as_sent=True))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


WRITES = ("AppendMessage", "AppendMessages", "UpdateMessage", "UpsertMessage", "GetMessage")


def _record(monkeypatch: pytest.MonkeyPatch, stub: Any) -> list[tuple[str, Any]]:
    """The requests the client sends through `stub`, by method."""
    calls: list[tuple[str, Any]] = []

    def recorder(name: str) -> Any:
        call = getattr(stub, name)

        def recorded(request: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, request))
            return call(request, *args, **kwargs)

        return recorded

    for name in WRITES:
        monkeypatch.setattr(stub, name, recorder(name))
    return calls


def _assert_each_write_asked(calls: list[tuple[str, Any]]) -> None:
    """The scenario's five writes, no read back, each asking to leave out JSON stored as sent."""
    assert [name for name, _ in calls] == [
        "AppendMessage",
        "AppendMessage",
        "AppendMessages",
        "UpdateMessage",
        "UpsertMessage",
    ]
    assert all(request.omit_json_as_sent for _, request in calls)


def test_the_python_client_asks_for_json_as_sent_to_be_left_out(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record(monkeypatch, session._client._stub)
    sent, stored = _sanitized("s")
    assert session.append_message(text_message("a")).message == text_message("a")
    assert session.append_message(json.loads(sent)).message == json.loads(stored)  # inline: no read back
    results = session.append_messages([text_message("b"), text_message("c")])
    assert [r.message for r in results] == [text_message("b"), text_message("c")]
    assert session.update_message(text_message("a", "new")) == text_message("a", "new")
    assert session.upsert_message(text_message("d")).message == text_message("d")
    _assert_each_write_asked(calls)


def test_the_asyncio_client_asks_for_json_as_sent_to_be_left_out(
    live_server: Any, object_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions_client.aio import SessionsClient

    async def scenario() -> list[tuple[str, Any]]:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            calls = _record(monkeypatch, session._client._stub)
            sent, stored = _sanitized("s")
            assert (await session.append_message(text_message("a"))).message == text_message("a")
            assert (await session.append_message(json.loads(sent))).message == json.loads(stored)
            results = await session.append_messages([text_message("b"), text_message("c")])
            assert [r.message for r in results] == [text_message("b"), text_message("c")]
            assert await session.update_message(text_message("a", "new")) == text_message("a", "new")
            assert (await session.upsert_message(text_message("d"))).message == text_message("d")
            return calls

    calls = asyncio.run(scenario())
    _assert_each_write_asked(calls)


def test_client_results_carry_the_stored_json_and_parse_it_only_when_read(live_server: Any, object_key: str) -> None:
    """A caller who only checks `inserted` pays nothing for the message: the results hold the
    stored JSON (the JSON sent, when stored as sent) and parse it on first read, once."""
    from sessions_client import SessionsClient
    from sessions_client.aio import SessionsClient as AsyncSessionsClient

    sent, stored = _sanitized("s")

    def check(result: Any, json_text: str) -> None:
        assert result.message_json == json_text
        assert "message" not in vars(result)  # not parsed yet
        assert result.message == json.loads(json_text)
        assert result.message is result.message  # parsed once

    with SessionsClient(live_server.address) as client:
        session = client.object(object_key).session("sync")
        check(session.append_message(text_message("a")), js_json(text_message("a")))
        check(session.append_message(sent), stored)
        for result, message in zip(session.append_messages([text_message("b"), text_message("c")]), "bc", strict=True):
            check(result, js_json(text_message(message)))
        check(session.upsert_message(text_message("d")), js_json(text_message("d")))

    async def scenario() -> None:
        async with AsyncSessionsClient(live_server.address) as client:
            session = client.object(object_key).session("aio")
            check(await session.append_message(text_message("a")), js_json(text_message("a")))
            check(await session.append_message(sent), stored)
            check(await session.upsert_message(text_message("d")), js_json(text_message("d")))

    asyncio.run(scenario())


def test_json_left_out_for_want_of_room_is_read_back_in_one_call(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose changed JSON passes a response's room gets the rest back by one GetMessages,
    not a GetMessage per message (1,500 of them here)."""
    pad = "x" * 2_500
    pairs = []
    for i in range(1_500):
        stored = text_message(f"s{i:04d}", pad, role="assistant")
        sent = {**stored, "parts": [{**stored["parts"][0], "providerMetadata": {"openai": {"itemId": "item_1"}}}]}
        pairs.append((sent, stored))
    calls: list[str] = []
    stub = session._client._stub
    for name in ("GetMessage", "GetMessages"):
        method = getattr(stub, name)
        monkeypatch.setattr(stub, name, lambda *a, _m=method, _n=name, **k: calls.append(_n) or _m(*a, **k))

    results = session.append_messages([sent for sent, _ in pairs])

    assert [r.message for r in results] == [stored for _, stored in pairs]
    assert calls == ["GetMessages"]  # about 3.9 MB of changed JSON: some of it had no room
