"""The asyncio client does the same round trip as the blocking one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import ImportItem, SessionsError
from sessions_client.aio import SessionsClient
from tests.service.support import ids, js_json, message_rows, stored_json, text_message


def test_aio_round_trip(live_server: Any, data_dir: Path, object_key: str) -> None:
    async def scenario() -> None:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session("s")
            first = await session.append_message(text_message("a", "hello"))
            assert (first.inserted, first.parent_id) == (True, None)
            second = await session.append_message(text_message("b"))
            assert second.parent_id == "a"
            dup = await session.append_message(text_message("a", "other"))
            assert (dup.inserted, dup.message) == (False, text_message("a", "hello"))
            results = await session.append_messages([text_message("c"), text_message("d")], parent_id="a")
            assert [r.parent_id for r in results] == ["a", "c"]

            assert await session.update_message(text_message("b", "new")) == text_message("b", "new")
            assert await session.update_message(text_message("zz")) is None
            upsert = await session.upsert_message(text_message("e"), parent_id=None)
            assert upsert.inserted is True

            assert await session.get_message("b") == text_message("b", "new")
            assert await session.get_message("missing") is None
            assert (await session.get_latest_leaf())["id"] == "e"
            assert ids(await session.get_branches("a")) == ["b", "c"]
            assert ids(await session.get_history(leaf_id="d")) == ["a", "c", "d"]
            assert ids(await session.get_history(leaf_id="d", newest_first=True)) == ["d", "c", "a"]
            streamed = [m["id"] async for m in session.history(leaf_id="d")]
            assert streamed == ["a", "c", "d"]
            batches = [ids(b) async for b in session.history_batches(batch_size=2, leaf_id="d")]
            assert batches == [["a", "c"], ["d"]]
            recent = await session.get_recent_history(1, leaf_id="d")
            assert (ids(recent.messages), recent.truncated) == (["d"], True)
            stats = await session.get_history_row_stats(leaf_id="d")
            assert recent.total_content_bytes == sum(s.bytes for s in stats)

            imported = await session.import_messages([ImportItem(text_message("i"), "d", 42)])
            assert (imported.imported, imported.skipped) == (1, 0)
            assert (await session.get_latest_leaf())["id"] == "i"
            assert await session.delete_messages(["c"]) == 1
            assert ids(await session.get_history(leaf_id="d")) == ["a", "d"]

            big = text_message("big", "😀" * 1_500_000)  # 6 MB: the streaming write path
            assert (await session.append_message(big)).inserted is True
            assert await session.get_message("big") == big

            with pytest.raises(SessionsError) as caught:
                await session.append_message("{not json")
            assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.reason == "INVALID_JSON"

    asyncio.run(scenario())

    assert stored_json(data_dir, object_key, "big", "s") == js_json(text_message("big", "😀" * 1_500_000))
    assert [r["id"] for r in message_rows(data_dir, object_key, "s")] == ["a", "b", "d", "e", "i", "big"]


def test_aio_clear(live_server: Any, data_dir: Path, object_key: str) -> None:
    async def scenario() -> None:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            await session.append_messages([text_message("a"), text_message("b")])
            assert await session.clear_messages() == 2
            assert await session.get_history() == []

    asyncio.run(scenario())
    assert message_rows(data_dir, object_key) == []


def test_aio_client_reads_an_omitted_message_back_only_when_the_server_changed_it(
    live_server: Any, object_key: str
) -> None:
    kept = text_message("kept", "k" * 5_000_000)
    stored = text_message("changed", "c" * 5_000_000)
    sent = text_message("changed", "c" * 5_000_000)
    sent["parts"][0]["providerMetadata"] = {"openai": {"itemId": "item_1"}}  # the server strips it

    async def scenario() -> list[str]:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            reads: list[str] = []
            get_message = session._client._stub.GetMessage

            def counted(request: Any, **kwargs: Any) -> Any:
                reads.append(request.message_id)
                return get_message(request, **kwargs)

            session._client._stub.GetMessage = counted
            assert (await session.append_message(kept)).message == kept  # as sent: no read back
            assert (await session.append_message(sent)).message == stored  # changed: read back
            assert (await session.upsert_message(kept)).message == kept
            return reads

    assert asyncio.run(scenario()) == ["changed"]


def test_aio_json_left_out_for_want_of_room_is_read_back_in_one_call(live_server: Any, object_key: str) -> None:
    pairs = []
    for i in range(1_500):
        stored = text_message(f"s{i:04d}", "x" * 2_500, role="assistant")
        sent = {**stored, "parts": [{**stored["parts"][0], "providerMetadata": {"openai": {"itemId": "item_1"}}}]}
        pairs.append((sent, stored))

    async def scenario() -> tuple[list[Any], list[str]]:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            calls: list[str] = []
            stub = session._client._stub
            for name in ("GetMessage", "GetMessages"):
                method = getattr(stub, name)
                setattr(stub, name, lambda *a, _m=method, _n=name, **k: calls.append(_n) or _m(*a, **k))
            results = await session.append_messages([sent for sent, _ in pairs])
            return [r.message for r in results], calls

    messages, calls = asyncio.run(scenario())
    assert messages == [stored for _, stored in pairs]
    assert calls == ["GetMessages"]


def test_aio_mirror_follows_the_session_and_rereads_on_reset(live_server: Any, object_key: str) -> None:
    """The asyncio client had no `mirror()`: the same list kept by the same events, a reset
    reading the history again (awaited)."""

    async def scenario() -> None:
        async with SessionsClient(live_server.address) as client:
            obj = client.object(object_key)
            session = obj.session("mirrored")
            await session.append_message(text_message("pre"))
            mirror = await session.mirror()
            assert mirror.messages == await session.get_history()
            await session.append_message(text_message("a"))
            await session.update_message(text_message("pre", "edited"))
            await obj.session("elsewhere").append_message(text_message("x"))
            await session.delete_messages(["a"])
            await session.append_message(text_message("b"))
            feed = obj.subscribe(session_id=session.id, resume_from=mirror.revision)
            for _ in range(4):  # the other session's append is filtered out
                await mirror.apply(await anext(feed))
            assert mirror.messages == await session.get_history()
            assert [m["id"] for m in mirror.messages] == ["pre", "b"]

            mirror.messages = []  # out of date: a reset reads it again
            resumed = obj.subscribe(resume_from=1)
            reset = await anext(resumed)
            await resumed.aclose()
            assert reset.type == "reset"
            await mirror.apply(reset)
            assert mirror.messages == await session.get_history()
            await feed.aclose()

    asyncio.run(scenario())


def test_aio_an_import_source_that_fails_raises_its_own_error(live_server: Any, object_key: str) -> None:
    """What the caller's items raise while the stream is sent (its iterator failing, a message
    JSON cannot hold) is raised as itself: grpc.aio cancelled the call, and the caller got a bare
    CancelledError, which `except Exception` does not catch, and no cause."""

    def source() -> Any:
        yield text_message("a")
        raise RuntimeError("the source server went away")

    async def scenario() -> None:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            with pytest.raises(RuntimeError, match="the source server went away"):
                await session.import_messages(source())
            with pytest.raises(ValueError, match="JSON"):
                await session.import_messages([text_message("b"), {**text_message("c"), "score": float("nan")}])
            with pytest.raises(ValueError, match="JSON"):
                await session.import_messages(iter([{**text_message("c"), "score": float("nan")}]))
            assert await session.get_message("c") is None
            assert (await session.import_messages([text_message("d")])).imported == 1  # the client goes on

    asyncio.run(scenario())


def test_aio_an_import_takes_an_async_iterable(live_server: Any, object_key: str) -> None:
    """Another session's `history()`, an async generator, is the natural source of a copy: it
    was refused (TypeError: not iterable). Its messages go as they come, chained; what the
    iterable raises is raised as itself."""

    async def failing() -> Any:
        yield text_message("x")
        raise RuntimeError("the source went away")

    async def scenario() -> None:
        async with SessionsClient(live_server.address) as client:
            source = client.object(object_key).session("source")
            await source.append_messages([text_message(f"m{i}") for i in range(5)])
            copy = client.object(object_key).session("copy")
            result = await copy.import_messages(source.history())
            assert (result.imported, result.skipped) == (5, 0)
            assert await copy.get_history() == await source.get_history()
            assert (await copy.import_messages(source.history())).skipped == 5  # ids it holds
            with pytest.raises(RuntimeError, match="the source went away"):
                await client.object(object_key).session("other").import_messages(failing())

    asyncio.run(scenario())


def test_aio_a_large_message_utf8_cannot_carry_raises_as_a_small_one_does(live_server: Any, object_key: str) -> None:
    """As the blocking client's: grpc.aio ended the upload with a bare CancelledError."""
    text = '{"id":"a","role":"user","parts":[{"type":"text","text":"' + "x" * (4 << 20) + '\ud800"}]}'

    async def scenario() -> None:
        async with SessionsClient(live_server.address) as client:
            session = client.object(object_key).session()
            with pytest.raises(SessionsError, match="lone UTF-16 surrogate"):
                await session.append_message(text)
            assert await session.get_message("a") is None

    asyncio.run(scenario())
