"""ListCompactions pages: by count and by bytes, each record once, in seq order, through gRPC."""

from __future__ import annotations

import base64
import uuid

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc

FOUR_MIB = 4 * 1024 * 1024


def add_records(stub: pb_grpc.SessionServiceStub, key: str, summaries: list[str]) -> list[int]:
    return [
        stub.AddCompaction(
            pb.AddCompactionRequest(object_key=key, summary=summary, from_message_id="a", to_message_id="b")
        ).compaction.seq
        for summary in summaries
    ]


def pages(stub: pb_grpc.SessionServiceStub, key: str, page_size: int) -> list[pb.ListCompactionsResponse]:
    out: list[pb.ListCompactionsResponse] = []
    token = ""
    while True:
        out.append(
            stub.ListCompactions(pb.ListCompactionsRequest(object_key=key, page_size=page_size, page_token=token))
        )
        if not (token := out[-1].next_page_token):
            return out


@pytest.mark.parametrize(
    ("records", "page_size", "expected"),
    [(250, 100, [100, 100, 50]), (200, 100, [100, 100]), (120, 0, [100, 20]), (3, 1, [1, 1, 1]), (0, 10, [0])],
)
def test_pages_hold_page_size_records_and_the_last_says_so(
    stub: pb_grpc.SessionServiceStub, records: int, page_size: int, expected: list[int]
) -> None:
    key = f"listing-{uuid.uuid4().hex}"
    seqs = add_records(stub, key, [f"summary {i}" for i in range(records)])

    listed = pages(stub, key, page_size)

    assert [len(page.compactions) for page in listed] == expected
    assert [record.seq for page in listed for record in page.compactions] == seqs
    assert [record.summary for page in listed for record in page.compactions] == [
        f"summary {i}" for i in range(records)
    ]


def test_pages_of_large_summaries_stay_within_a_response(stub: pb_grpc.SessionServiceStub) -> None:
    key = f"listing-{uuid.uuid4().hex}"
    summaries = [chr(ord("a") + i) * 1_000_000 for i in range(5)] + ["é" * 500_000]  # 1 MB each
    seqs = add_records(stub, key, summaries)

    listed = pages(stub, key, 1000)

    assert len(listed) > 1
    assert all(0 < page.ByteSize() <= FOUR_MIB for page in listed)
    assert [record.seq for page in listed for record in page.compactions] == seqs
    assert [record.summary for page in listed for record in page.compactions] == summaries


@pytest.mark.parametrize(
    # Python's int() took all but the first: signs, underscores and spaces, another script's
    # digits (wrong pages), and a number past SQLite's (INTERNAL).
    "token",
    ["not-a-seq", "-1", "+2", " 1_0 ", "\u0662", "9223372036854775808"],
)
def test_a_token_it_did_not_issue_is_refused(stub: pb_grpc.SessionServiceStub, token: str) -> None:
    key = f"listing-{uuid.uuid4().hex}"
    add_records(stub, key, ["one"])
    with pytest.raises(grpc.RpcError) as refused:
        stub.ListCompactions(pb.ListCompactionsRequest(object_key=key, page_token=token))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    # 0 and leading zeros read as a position too: a 0 restarted the listing (a client looping).
    "position",
    [b"-1", b"+2", b" 1_0 ", "\u0662".encode(), b"9223372036854775808", b"", b"0", b"007"],
)
def test_a_token_edited_to_another_position_is_refused(stub: pb_grpc.SessionServiceStub, position: bytes) -> None:
    """Tokens are base64 with their position last: one edited to hold a position the server
    never writes is refused, not read by Python's lenient int()."""
    key = f"listing-{uuid.uuid4().hex}"
    add_records(stub, key, ["one", "two"])
    issued = stub.ListCompactions(pb.ListCompactionsRequest(object_key=key, page_size=1)).next_page_token
    raw = base64.urlsafe_b64decode(issued)
    seq = str(stub.ListCompactions(pb.ListCompactionsRequest(object_key=key)).compactions[0].seq).encode()
    assert raw.endswith(seq)
    edited = base64.urlsafe_b64encode(raw[: -len(seq)] + position).decode()
    assert stub.ListCompactions(pb.ListCompactionsRequest(object_key=key, page_token=issued)).compactions
    with pytest.raises(grpc.RpcError) as refused:
        stub.ListCompactions(pb.ListCompactionsRequest(object_key=key, page_token=edited))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token is not one this server issued" in (refused.value.details() or "")


def test_a_token_comes_back_only_with_its_object_and_session(stub: pb_grpc.SessionServiceStub) -> None:
    """A token names a position in one listing: with another object or session it was read as
    that position there (a page that skipped records, or repeated them). It is refused."""
    key, other_key = f"listing-{uuid.uuid4().hex}", f"listing-{uuid.uuid4().hex}"
    for object_key in (key, other_key):
        for session_id in ("", "other"):
            for summary in ("one", "two", "three"):
                stub.AddCompaction(
                    pb.AddCompactionRequest(
                        object_key=object_key,
                        session_id=session_id,
                        summary=summary,
                        from_message_id="a",
                        to_message_id="b",
                    )
                )
    first = stub.ListCompactions(pb.ListCompactionsRequest(object_key=key, page_size=1))
    for object_key, session_id in ((key, "other"), (other_key, ""), (other_key, "other")):
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListCompactions(
                pb.ListCompactionsRequest(
                    object_key=object_key, session_id=session_id, page_token=first.next_page_token
                )
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_token belongs to a listing of another object or session" in (refused.value.details() or "")
    rest = stub.ListCompactions(pb.ListCompactionsRequest(object_key=key, page_token=first.next_page_token))
    assert [r.summary for r in (*first.compactions, *rest.compactions)] == ["one", "two", "three"]
