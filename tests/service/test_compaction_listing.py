"""ListCompactions pages: by count and by bytes, each record once, in seq order, through gRPC."""

from __future__ import annotations

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
