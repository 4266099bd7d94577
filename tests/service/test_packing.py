"""Packed responses: many messages per frame on request, never over 4 MiB, batches respected."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessions_client._common import FrameAssembler, routing_metadata
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from sessions_server.domain import paths
from sessions_server.domain.service import AppendInput, AppendResult, SessionsService
from sessions_server.domain.views import MessageView
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import MAX_PATH_DEPTH, Parent, RowInfo
from sessions_server.transport import framing, packed_cache
from sessions_server.transport.servicer import _responses

FOUR_MIB = 4 * 1024 * 1024


def _text(message_id: str, size: int) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": "y" * size}]}


def _read(responses: Any) -> tuple[list[dict[str, Any]], list[int], list[bool]]:
    assembler = FrameAssembler()
    messages, per_response, ends = [], [], []
    for response in responses:
        assert response.ByteSize() <= FOUR_MIB
        frames = list(response.frames) or ([response.frame] if response.HasField("frame") else [])
        per_response.append(len(frames))
        ends.append(getattr(response, "batch_end", False))
        for frame in frames:
            done = assembler.feed(frame)
            if done is not None:
                messages.append(json.loads(done.json))
    return messages, per_response, ends


def test_history_packs_messages_and_keeps_large_ones_in_pieces(live_server: Any, session: Any, object_key: str) -> None:
    sent = (
        [_text(f"m{i}", 100) for i in range(25)] + [_text("big", 7_000_000)] + [_text(f"n{i}", 100) for i in range(5)]
    )
    for message in sent:
        session.append_message(message)
    channel = grpc.insecure_channel(live_server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(channel)
    request = pb.StreamHistoryRequest(object_key=object_key, max_messages_per_response=10)
    messages, per_response, _ = _read(stub.StreamHistory(request, metadata=routing_metadata(object_key)))
    assert messages == sent
    assert max(per_response) == 10  # packed
    assert len(per_response) < len(sent)  # fewer responses than messages
    unpacked, counts, _ = _read(stub.StreamHistory(pb.StreamHistoryRequest(object_key=object_key)))
    assert unpacked == sent and max(counts) == 1  # the default stays one message per response
    channel.close()


def test_packed_batches_end_on_batch_boundaries(live_server: Any, session: Any, object_key: str) -> None:
    session.append_messages([_text(f"m{i}", 10) for i in range(7)])
    channel = grpc.insecure_channel(live_server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(channel)
    request = pb.StreamHistoryRequest(object_key=object_key, batch_size=3, max_messages_per_response=100)
    messages, per_response, ends = _read(stub.StreamHistory(request))
    assert [m["id"] for m in messages] == [f"m{i}" for i in range(7)]
    assert per_response == [3, 3, 1] and ends == [True, True, True]
    channel.close()


def test_recent_history_and_get_messages_pack(live_server: Any, session: Any, object_key: str) -> None:
    sent = [_text(f"m{i}", 50) for i in range(12)]
    session.append_messages(sent)
    channel = grpc.insecure_channel(live_server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(channel)
    recent = list(
        stub.GetRecentHistory(
            pb.GetRecentHistoryRequest(object_key=object_key, max_content_bytes=10**9, max_messages_per_response=5)
        )
    )
    assert recent[0].HasField("summary")
    messages, per_response, _ = _read(recent[1:])
    assert messages == sent and max(per_response) == 5
    got, counts, _ = _read(
        stub.GetMessages(
            pb.GetMessagesRequest(
                object_key=object_key, message_ids=[m["id"] for m in sent], max_messages_per_response=4
            )
        )
    )
    assert got == sent and max(counts) == 4
    channel.close()


def test_packed_frames_equal_single_frames_and_stay_equal_when_read_again(
    live_server: Any, session: Any, object_key: str
) -> None:
    """Packed responses are encoded from per-message encodings the server keeps with the messages
    it remembers: every frame (info included, and a compaction overlay's) must be the frame an
    unpacked read sends, on the first read and on later ones served from memory."""
    session.append_messages([_text(f"m{i}", 40 + i) for i in range(9)])
    session.append_message(_text("branch", 5), parent_id="m3")
    session.append_message(_text("tail", 5), parent_id="m8")
    session.add_compaction("summary of m1..m2", "m1", "m2")
    channel = grpc.insecure_channel(live_server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(channel)
    md = routing_metadata(object_key)

    def frames(per_response: int) -> list[tuple[pb.MessageInfo, dict[str, Any], bool]]:
        request = pb.StreamHistoryRequest(object_key=object_key, max_messages_per_response=per_response)
        out = []
        for response in stub.StreamHistory(request, metadata=md):
            for frame in response.frames if per_response > 1 else [response.frame]:
                message = json.loads(frame.json)
                if frame.info.overlay:
                    message.pop("createdAt")  # an overlay carries the time of the read
                out.append((frame.info, message, frame.more_pieces))
        return out

    single = frames(1)
    infos = [info for info, _, _ in single]
    assert [info.id for info in infos[:3]] == ["m0", infos[1].id, "m3"] and infos[1].overlay
    assert infos[1].id.startswith("compaction_") and not infos[1].HasField("parent_id")
    assert infos[-1].id == "tail" and infos[-1].parent_id == "m8" and infos[-1].seq == 11
    for _ in range(3):
        assert frames(4) == single
    channel.close()


def test_remembered_large_messages_still_keep_responses_under_four_mib(
    live_server: Any, session: Any, object_key: str
) -> None:
    """Messages between the pack limit (1 MiB) and the piece size (3 MiB) each get a response of
    their own, also when read again from the server's memory (framed from kept encodings)."""
    sent = [_text(f"m{i}", 2_500_000) for i in range(3)] + [_text("small", 10)]
    session.append_messages(sent)
    channel = grpc.insecure_channel(live_server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(channel)
    request = pb.StreamHistoryRequest(object_key=object_key, max_messages_per_response=400)
    for _ in range(3):  # the first read from storage, then from memory
        messages, per_response, _ = _read(stub.StreamHistory(request, metadata=routing_metadata(object_key)))
        assert messages == sent
        assert per_response == [1, 1, 1, 1]
    channel.close()


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=400_000), min_size=1, max_size=60),
    max_messages=st.integers(min_value=2, max_value=20),
    encoded_before=st.lists(st.booleans(), min_size=60, max_size=60),
)
@settings(max_examples=60, deadline=None)
def test_a_window_is_packed_whole_within_the_limits(
    sizes: list[int], max_messages: int, encoded_before: list[bool]
) -> None:
    """A window is cut and joined in one go, encoding the views that have no encoding yet.
    When all had one (a remembered read), the bytes equal the message-by-message packing;
    always, every message arrives once, in order, within the count and size limits."""
    views = [
        MessageView(RowInfo(f"m{i}", "user", None, i, 0, 0), json.dumps(_text(f"m{i}", size)))
        for i, size in enumerate(sizes)
    ]
    for view, before in zip(views, encoded_before, strict=False):
        if before:
            framing.encoded_frame(view)
    responses = list(framing.window_responses(views, max_messages, pb.GetMessagesResponse))
    assert all(view.encoded is not None for view in views)  # kept for the next read
    if all(encoded_before[: len(views)]):
        marked = [(view, False) for view in views]
        assert responses == [r for r, _ in framing.framed_responses(marked, max_messages, pb.GetMessagesResponse)]
    decoded = [pb.GetMessagesResponse.FromString(response) for response in responses]
    assert [frame.json for response in decoded for frame in response.frames] == [view.json for view in views]
    for response in decoded:
        assert 1 <= len(response.frames) <= max_messages
        assert len(response.frames) == 1 or response.ByteSize() <= framing.PACK_BYTES + 4 * len(response.frames)


@pytest.fixture
def fresh_packed(fresh_memo: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An empty cache of packed responses and memo, put back afterwards."""
    fresh_memo.setattr(packed_cache, "_kept", OrderedDict())
    fresh_memo.setattr(packed_cache, "_kept_bytes", 0)
    fresh_memo.setattr(packed_cache, "MAX_PACKED_BYTES", packed_cache.MAX_PACKED_BYTES)
    return fresh_memo


def _read_packed(service: SessionsService, key: str, max_messages: int) -> list[bytes]:
    async def read() -> list[bytes]:
        out: list[bytes] = []
        async for window in service.history(key, ""):
            out += [bytes(r) for r in framing.window_responses(window, max_messages, pb.StreamHistoryResponse)]
        return out

    return asyncio.run(read())


def _ids(responses: list[bytes]) -> list[str]:
    return [f.info.id for r in responses for f in pb.StreamHistoryResponse.FromString(r).frames]


def test_kept_responses_do_not_pile_up_at_the_depth_cap(tmp_path: Path, fresh_packed: pytest.MonkeyPatch) -> None:
    """Past the depth cap every append moves the path's start by a row. A read then stops its
    first response where a kept one begins and does not keep it: what is kept stays one read's
    worth however many appends come, and every read still returns the right rows."""
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
    cap_rows = MAX_PATH_DEPTH + 1
    ids = [f"c{n:05d}" for n in range(cap_rows)]

    async def build() -> None:
        for start in range(0, cap_rows, 2_000):
            items = [AppendInput(json.dumps(_text(i, 10)), Parent.auto(), True) for i in ids[start : start + 2_000]]
            await service.append_many("cap", "", items)

    asyncio.run(build())
    for _ in range(3):  # from storage; remembered; then from kept responses
        assert _ids(_read_packed(service, "cap", 400)) == ids
    kept = packed_cache.kept_bytes()
    assert kept > 0
    for n in range(30):
        ids.append(f"d{n:02d}")
        asyncio.run(service.append("cap", "", json.dumps(_text(ids[-1], 10)), Parent.auto(), from_client=True))
        assert _ids(_read_packed(service, "cap", 400)) == ids[-cap_rows:]
        assert packed_cache.kept_bytes() <= kept + 2 * 400 * 100  # at most the tail kept anew


def test_only_remembered_reads_keep_responses_within_the_budget(
    tmp_path: Path, fresh_packed: pytest.MonkeyPatch
) -> None:
    service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
    for key in ("a", "b"):
        items = [AppendInput(json.dumps(_text(f"{key}{n}", 100)), Parent.auto(), True) for n in range(50)]
        asyncio.run(service.append_many(key, "", items))
    fresh_packed.setattr(paths, "MAX_VIEW_BYTES", 0)  # nothing remembered: every read is fresh
    fresh_packed.setattr(paths, "MAX_SESSION_VIEW_BYTES", 0)
    for _ in range(2):
        _read_packed(service, "a", 5)
    assert packed_cache.kept_bytes() == 0
    fresh_packed.setattr(paths, "MAX_VIEW_BYTES", 10**8)
    fresh_packed.setattr(paths, "MAX_SESSION_VIEW_BYTES", 10**7)
    for _ in range(2):
        first = _read_packed(service, "a", 5)
    one_read = packed_cache.kept_bytes()
    assert one_read > 0 and len(packed_cache.kept_responses()) == 10
    packed_cache.set_budget(one_read)  # room for one session's responses
    for _ in range(2):
        _read_packed(service, "b", 5)
    assert packed_cache.kept_bytes() <= one_read
    assert all(
        entry.first.info is not None and entry.first.info.id.startswith("b") for entry in packed_cache.kept_responses()
    )
    assert _read_packed(service, "a", 5) == first  # evicted: built again, the same bytes


@given(
    outcomes=st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=1_200_000), st.booleans(), st.sampled_from("xy")),
        max_size=8,
    ),
    omit=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_append_results_encode_as_the_protobuf_types_do(
    outcomes: list[tuple[bool, int, bool, str]], omit: bool
) -> None:
    """Append responses are encoded from the views' frame encodings: the bytes must be what
    the protobuf types give, JSON past the response's budget omitted (and marked as sent when
    the request carried exactly that JSON), JSON as sent omitted when the request asked
    (`omit`), a refused overlay's info present and empty."""
    results = [
        AppendResult(
            inserted,
            MessageView(RowInfo(f"m{i}", "user", "p" if i else None, i, 7, 3) if has_row else None, "x" * size),
        )
        for i, (inserted, size, has_row, _) in enumerate(outcomes)
    ]
    sent = [letter * size for _, size, _, letter in outcomes]  # "x": the stored JSON is as sent
    budget = framing.ResponseBudget()
    expected = pb.AppendMessagesResponse(
        results=[
            pb.AppendResult(inserted=r.inserted, message=framing.written_message(r.message, budget, text, omit))
            for r, text in zip(results, sent, strict=True)
        ]
    )
    assert framing.encoded_append_results(results, sent, omit) == expected.SerializeToString()
    for result, text in zip(results, sent, strict=True):
        single = pb.AppendMessageResponse(
            inserted=result.inserted, message=framing.written_message(result.message, sent=text, omit_as_sent=omit)
        )
        encoded = framing.encoded_append_result(result, framing.ResponseBudget(), pb.AppendMessageResponse, text, omit)
        assert encoded == single.SerializeToString()
        if single.message.json_omitted:
            assert single.message.json_as_sent == (text == result.message.json)
        if omit and text == result.message.json:
            assert single.message.json_omitted and single.message.json == ""


@given(text=st.one_of(st.text(alphabet=st.characters(max_codepoint=0x7F)), st.text()), piece_bytes=st.integers(4, 40))
@settings(max_examples=300, deadline=None)
def test_pieces_rejoin_to_the_text_and_stay_under_the_piece_size(text: str, piece_bytes: int) -> None:
    """ASCII text is cut as it is (a character is a byte), other text on UTF-8 boundaries. A
    piece holds at least one character (4 bytes; responses cut at 3 MiB)."""
    pieces = list(framing.split_utf8(text, piece_bytes))
    assert "".join(pieces) == text
    assert all(len(p.encode("utf-8", "surrogatepass")) <= piece_bytes for p in pieces)
    assert all(pieces) or pieces == [""]  # the empty text is one empty piece
    if text.isascii() and len(text) * 4 > piece_bytes:
        assert [len(p) for p in pieces] == [min(piece_bytes, len(text) - i) for i in range(0, len(text), piece_bytes)]


def test_pieces_must_hold_any_character() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        list(framing.split_utf8("€€", 3))


def _reference_frames(view: MessageView, piece_bytes: int) -> list[pb.MessageFrame]:
    """The frames of one message as protobuf objects would build them (the encoding's reference)."""
    pieces = list(framing.split_utf8(view.json, piece_bytes))
    frames = []
    for index, piece in enumerate(pieces):
        frame = pb.MessageFrame(json=piece, more_pieces=index < len(pieces) - 1)
        if index == 0:
            framing._fill_info(frame.info, view)
        frames.append(frame)
    return frames


@given(
    text=st.one_of(st.text(alphabet=st.characters(max_codepoint=0x7F)), st.text()),
    piece_bytes=st.integers(4, 40),
    has_info=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_encoded_message_responses_are_what_protobuf_encodes(text: str, piece_bytes: int, has_info: bool) -> None:
    """GetMessage's responses and a stream's pieces are encoded by hand from the JSON's bytes:
    byte for byte what the protobuf objects would serialize, info on the first piece only,
    `more_pieces` on all but the last; a batch that ends with the message ends on its last piece."""
    info = RowInfo("m1", "assistant", "m0", 7, 1_700_000_000_000, 42) if has_info else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "PIECE_BYTES", piece_bytes)
        frames = _reference_frames(MessageView(info, text), piece_bytes)

        got = list(framing.message_responses(MessageView(info, text), pb.GetMessageResponse))
        assert got == [pb.GetMessageResponse(frame=frame).SerializeToString() for frame in frames]

        for max_messages in (1, 400):
            view = MessageView(info, text)
            streamed = list(framing.framed_responses([(view, True)], max_messages, pb.StreamHistoryResponse))
            reference = [
                pb.StreamHistoryResponse(frames=[frame]) if max_messages > 1 else pb.StreamHistoryResponse(frame=frame)
                for frame in frames
            ]
            decoded = [pb.StreamHistoryResponse.FromString(r) if isinstance(r, bytes) else r for r, _ in streamed]
            assert decoded == reference
            assert [end for _, end in streamed] == [index == len(frames) - 1 for index in range(len(frames))]


def test_a_message_rewritten_in_place_is_not_sent_from_a_kept_response(
    live_server: Any, session: Any, object_key: str
) -> None:
    """An update restates the remembered messages in place: a kept packed response that holds
    the rewritten message between its first and its last must not be sent again as it was."""
    sent = [_text(f"m{i}", 30) for i in range(30)]
    session.append_messages(sent)
    channel = grpc.insecure_channel(live_server.address)
    stub = sessions_pb2_grpc.SessionServiceStub(channel)
    request = pb.StreamHistoryRequest(object_key=object_key, max_messages_per_response=4)

    def texts() -> list[str]:
        messages, _, _ = _read(stub.StreamHistory(request, metadata=routing_metadata(object_key)))
        return [message["parts"][0]["text"] for message in messages]

    for _ in range(3):  # remembered, encoded, then packed and kept
        assert texts() == [message["parts"][0]["text"] for message in sent]
    for index, rewrite in ((5, "first rewrite"), (5, "second rewrite"), (17, "another")):
        session.update_message({"id": f"m{index}", "role": "user", "parts": [{"type": "text", "text": rewrite}]})
        sent[index]["parts"][0]["text"] = rewrite
        for _ in range(2):
            assert texts() == [message["parts"][0]["text"] for message in sent]
    channel.close()


def test_a_response_packed_from_a_window_taken_before_an_update_is_not_kept(
    tmp_path: Path, fresh_packed: pytest.MonkeyPatch
) -> None:
    """A read packs each response as it sends it: an update that lands between two of them
    replaces a message of the window the read took before. The response built from the old
    message goes out (the read began before the update) but must not be kept for later reads."""

    def texts(responses: list[Any]) -> list[str]:
        messages, _, _ = _read(pb.StreamHistoryResponse.FromString(r) if isinstance(r, bytes) else r for r in responses)
        return [message["parts"][0]["text"] for message in messages]

    async def read(service: SessionsService, between: Any = None) -> list[str]:
        responses = []
        async for response, _ in _responses(service.history("k", ""), 5, pb.StreamHistoryResponse):
            responses.append(response)
            if between is not None and len(responses) == 1:
                await between()
        return texts(responses)

    async def scenario() -> tuple[list[str], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append_many(
                "k", "", [AppendInput(json.dumps(_text(f"m{i}", 3 + i)), Parent.auto(), True) for i in range(20)]
            )
            for _ in range(2):  # remembered and encoded, then packed and kept
                await read(service)

            async def update() -> None:
                changed = {"id": "m7", "role": "user", "parts": [{"type": "text", "text": "CHANGED"}]}
                assert (await service.update("k", "", json.dumps(changed), from_client=True)).changed

            during = await read(service, update)
            return during, await read(service)
        finally:
            await service.registry.close_all()

    during, after = asyncio.run(scenario())
    assert during[7] in ("y" * 10, "CHANGED")
    assert after[7] == "CHANGED" and after[:7] == during[:7] and after[8:] == during[8:]


def test_a_large_messages_pieces_are_made_as_they_go() -> None:
    """Sending a large message held it twice more beside its text: encoded whole, and every
    piece made before the first went (to mark the last piece of a batch). A 100 MB message's read
    took the server's RSS up 367 MB, 268 MB once each piece is encoded as it goes, one ahead."""
    import tracemalloc

    text = json.dumps(_text("big", 24 * 1024 * 1024), separators=(",", ":"))
    view = MessageView(RowInfo("big", "user", None, 1, 0, 0), text)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        joined = []
        for response, _ in framing.framed_responses([(view, True)], 400, pb.StreamHistoryResponse):
            assert isinstance(response, bytes)
            joined.append(pb.StreamHistoryResponse.FromString(response).frames[0].json)
            del response
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert "".join(joined) == text
    # The pieces on their way and the test's own decoded copy, not two more copies of the text.
    assert peak < 1.5 * len(text), f"peak {peak / len(text):.2f}x the message"
