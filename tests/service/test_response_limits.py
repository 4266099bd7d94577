"""Every answer fits one response (4 MiB, what stock clients accept), so nothing is written that
cannot be answered: a batch's JSON gives way to its results' ids, a batch whose ids alone would
not fit is refused unwritten, and roles, like ids, are bounded because they travel beside every
frame. Before, such writes committed and then failed with the send limit's bare
RESOURCE_EXHAUSTED, or left rows that no read could carry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessions_client import SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import error_reason, js_json, message_rows, text_message

RESPONSE_LIMIT = 4 * 1024 * 1024


def spaced(message: dict[str, Any]) -> str:
    """JSON the server re-serializes (it stores JS's compact form), so it answers it inline."""
    return json.dumps(message, separators=(", ", ": "))


def test_a_batch_of_twelve_thousand_small_messages_is_answered_within_one_response(
    stub: Any, data_dir: Path, object_key: str
) -> None:
    # 12,000 results with ids the length of a UUID plus 3 MiB of inline JSON came to about 4.4 MB:
    # stored, and unanswered.
    messages = [text_message(f"m{i:05d}-{'x' * 30}", "a" * 300) for i in range(12_000)]
    request = pb.AppendMessagesRequest(
        object_key=object_key, items=[pb.AppendItem(message_json=spaced(m)) for m in messages]
    )
    response = stub.AppendMessages(request)  # the plain channel keeps gRPC's 4 MiB receive limit

    assert response.ByteSize() <= RESPONSE_LIMIT
    assert [r.message.info.id for r in response.results] == [m["id"] for m in messages]
    assert all(r.inserted for r in response.results)
    inline = [r for r in response.results if not r.message.json_omitted]
    omitted = [r for r in response.results if r.message.json_omitted]
    assert inline and omitted  # the JSON that fits comes inline, the rest is read back
    assert all(r.message.json == js_json(messages[int(r.message.info.id[1:6])]) for r in inline)
    assert not any(r.message.json_as_sent for r in omitted)  # the stored form differs from what was sent
    assert len(message_rows(data_dir, object_key)) == 12_000


def test_a_batch_whose_ids_would_not_fit_a_response_is_refused_unwritten(
    stub: Any, data_dir: Path, object_key: str
) -> None:
    stub.AppendMessage(pb.AppendMessageRequest(object_key=object_key, message_json=js_json(text_message("first"))))
    # Ids near their 16 KiB limit, each also the next one's parent: about 3.5 MB of ids to answer.
    long_ids = [f"{i:03d}" + "x" * 15_997 for i in range(110)]
    items = [pb.AppendItem(message_json=js_json(text_message(i))) for i in long_ids]
    with pytest.raises(grpc.RpcError) as caught:
        stub.AppendMessages(pb.AppendMessagesRequest(object_key=object_key, items=items, omit_json_as_sent=True))

    error = SessionsError.from_rpc_error(caught.value)
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.reason == "LIMIT_EXCEEDED"
    assert error.metadata["limit"] == "max_batch_result_bytes"
    assert "smaller batches" in error.message and "nothing was written" in error.message
    assert [r["id"] for r in message_rows(data_dir, object_key)] == ["first"]

    # Halves fit, and chain on as the whole batch would have.
    for half in (items[:55], items[55:]):
        response = stub.AppendMessages(
            pb.AppendMessagesRequest(object_key=object_key, items=half, omit_json_as_sent=True)
        )
        assert response.ByteSize() <= RESPONSE_LIMIT
        assert all(r.inserted for r in response.results)
    rows = message_rows(data_dir, object_key)
    assert [r["id"] for r in rows] == ["first", *long_ids]
    assert [r["parent_id"] for r in rows[1:]] == ["first", *long_ids[:-1]]


def test_a_batch_refused_so_on_a_key_never_written_creates_no_object(
    stub: Any, data_dir: Path, object_key: str
) -> None:
    """Refused inside its transaction, where parents are known, the batch had made the object
    first: the key was listed, with a file of 4.7 MB and no message."""
    long_ids = [f"{i:03d}" + "x" * 15_997 for i in range(110)]
    items = [pb.AppendItem(message_json=js_json(text_message(i))) for i in long_ids]
    with pytest.raises(grpc.RpcError) as caught:
        stub.AppendMessages(pb.AppendMessagesRequest(object_key=object_key, items=items, omit_json_as_sent=True))

    error = SessionsError.from_rpc_error(caught.value)
    assert (error.reason, error.metadata["limit"]) == ("LIMIT_EXCEEDED", "max_batch_result_bytes")
    assert "nothing was written" in error.message
    assert object_key not in stub.ListObjects(pb.ListObjectsRequest(page_size=1000)).object_keys
    assert stub.GetObjectStats(pb.GetObjectStatsRequest(object_key=object_key)).file_bytes == 0


@pytest.mark.parametrize("size", [16 * 1024 + 1, 5 * 1024 * 1024])
def test_a_role_past_its_limit_is_refused_on_every_write(
    session: Any, stub: Any, data_dir: Path, object_key: str, size: int
) -> None:
    # A 5 MB role was stored, and then no read of the session could carry its row.
    session.append_message(text_message("kept"))
    long_role = "r" * size
    attempts = [
        lambda: session.append_message(text_message("a", role=long_role)),
        lambda: session.append_messages([text_message("b"), text_message("c", role=long_role)]),
        lambda: session.update_message(text_message("kept", role=long_role)),
        lambda: session.upsert_message(text_message("d", role=long_role)),
        lambda: session.import_messages([text_message("e", role=long_role)]),
    ]
    for attempt in attempts:
        with pytest.raises(SessionsError) as caught:
            attempt()
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.reason == "LIMIT_EXCEEDED"
        assert caught.value.metadata["limit"] == "max_role_bytes"
    rows = message_rows(data_dir, object_key)
    assert [(r["id"], r["role"]) for r in rows] == [("kept", "user")]
    assert session.get_latest_leaf()["id"] == "kept"


def test_an_imported_parent_id_past_the_id_limit_is_refused(stub: Any, data_dir: Path, object_key: str) -> None:
    # Import stores parents verbatim (they need not exist), so their length is checked there.
    frames = [
        pb.ImportMessagesRequest(
            object_key=object_key, messages=[pb.ImportedMessage(json=js_json(text_message("ok")))]
        ),
        pb.ImportMessagesRequest(
            messages=[pb.ImportedMessage(json=js_json(text_message("child")), parent_id="p" * (16 * 1024 + 1))]
        ),
    ]
    with pytest.raises(grpc.RpcError) as caught:
        stub.ImportMessages(iter(frames))

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error_reason(caught.value) == "LIMIT_EXCEEDED"
    assert [r["id"] for r in message_rows(data_dir, object_key)] == ["ok"]  # not all or nothing


@pytest.mark.parametrize("fill", ["x", "é"])
def test_row_stats_of_long_ids_come_in_frames_within_a_response(
    stub: Any, session: Any, object_key: str, fill: str
) -> None:
    # 250 ids of 14-16 KB: about 4 MB of stats, cut by bytes (ASCII or not) as well as by count.
    long_ids = [f"{i:03d}" + fill * (15_990 if fill == "x" else 7_990) for i in range(250)]
    for start in range(0, len(long_ids), 50):
        session.append_messages([text_message(i) for i in long_ids[start : start + 50]])

    frames = list(stub.GetHistoryRowStats(pb.GetHistoryRowStatsRequest(object_key=object_key)))

    assert len(frames) >= 2
    assert all(frame.ByteSize() <= RESPONSE_LIMIT for frame in frames)
    assert [s.id for frame in frames for s in frame.stats] == long_ids
    assert all(s.role == "user" and s.bytes > 14_000 for frame in frames for s in frame.stats)


def test_row_stats_come_a_thousand_to_a_frame(stub: Any, session: Any, object_key: str) -> None:
    session.append_messages([text_message(f"m{i:04d}") for i in range(2_500)])

    frames = list(stub.GetHistoryRowStats(pb.GetHistoryRowStatsRequest(object_key=object_key)))

    assert [len(frame.stats) for frame in frames] == [1_000, 1_000, 500]
    assert [s.id for frame in frames for s in frame.stats] == [f"m{i:04d}" for i in range(2_500)]


def test_texts_at_the_largest_limits_a_server_takes_are_still_answered(tmp_path: Path) -> None:
    """A server started with every text limit at the most its flags take (ids and a role of
    128 KiB, a summary of 3 MiB): what it stores, it answers. Past those (e.g. a 5 MiB summary)
    the flags once let writes commit whose answers, lists, reads and change events then failed
    with the send limit's RESOURCE_EXHAUSTED, every time after."""
    from sessions_server.domain.limits import Limits
    from tests.conftest import start_server

    cap = 128 * 1024
    limits = Limits(max_message_id_bytes=cap, max_role_bytes=cap, max_summary_bytes=3 * 1024 * 1024)
    server = start_server(tmp_path / "data", limits=limits)
    first, second = "a" * cap, "b" * cap
    summary = "s" * limits.max_summary_bytes
    try:
        from sessions_client import SessionsClient

        with SessionsClient(server.address) as client:
            session = client.object("k").session("s" * 64)
            events = client.object("k").subscribe(include_progress=True, reconnect_attempts=0)
            assert next(events).type == "progress"
            session.append_message(
                {"id": first, "role": "r" * cap, "parts": [{"type": "text", "text": "x" * 5_000_000}]}
            )
            session.append_message({"id": second, "role": "r" * cap, "parts": [{"type": "text", "text": "y"}]})
            record = session.add_compaction(summary, first, first)
            assert record.summary == summary
            assert [stored.summary for stored in session.list_compactions()] == [summary]
            history = session.get_history()
            assert [len(message["parts"][0]["text"]) for message in history] == [len(summary), 1]
            newest = session.get_history(newest_first=True)
            assert [message["id"] for message in newest] == [second, history[0]["id"]]
            seen = [next(events) for _ in range(3)]
            assert [(event.type, len(event.message["id"]) if event.message else 0) for event in seen] == [
                ("append", cap),
                ("append", cap),
                ("compaction", 0),
            ]
            assert seen[2].compaction is not None and seen[2].compaction.summary == summary
            events.close()
    finally:
        server.stop()
