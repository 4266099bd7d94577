"""Search hits packed into fewer responses (`max_hits_per_response`), through a real server.

Every response costs the server a write, so a search that asks for packing gets its hits in a
few responses; one that does not (grpcurl) still gets one hit per response. Either way the hits,
their order and their text are the same, and a hit too large for one response comes in pieces.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from tests.service.support import text_message
from tests.service.test_search import big_text, same_text

PIECE_BYTES = 3 * 1024 * 1024  # the server's largest piece of text in one response
PACK_BYTES = 1024 * 1024  # about the most text a packed response carries


def _search(stub: Any, object_key: str, query: str, max_hits: int, limit: int = 999) -> list[pb.SearchMessagesResponse]:
    request = pb.SearchMessagesRequest(object_key=object_key, query=query, limit=limit, max_hits_per_response=max_hits)
    return list(stub.SearchMessages(request))


def _hits(responses: list[pb.SearchMessagesResponse]) -> list[tuple[str, str, str, str]]:
    """(id, role, session_id, text) of each hit, pieces joined, in order."""
    out: list[tuple[str, str, str, str]] = []
    head: Any = None
    pieces: list[str] = []
    for response in responses:
        for hit in response.hits or [response]:
            head = head or hit
            pieces.append(hit.content)
            if not hit.more_pieces:
                out.append((head.id, head.role, head.session_id, "".join(pieces)))
                head, pieces = None, []
    assert head is None, "the stream ended inside a hit"
    return out


def test_packed_responses_carry_the_hits_of_one_per_response(session: Any, stub: Any, object_key: str) -> None:
    session.append_messages([text_message(f"m{i:03d}", f"packed {i}", role="user") for i in range(45)])
    single = _search(stub, object_key, "packed", 0)
    assert len(single) == 45 and all(not r.hits and r.id for r in single)
    assert _search(stub, object_key, "packed", 1) == single  # 1 also means one hit per response

    for max_hits, sizes in ((7, [7] * 6 + [3]), (1000, [45])):
        packed = _search(stub, object_key, "packed", max_hits)
        assert [len(r.hits) for r in packed] == sizes
        assert all(not (r.id or r.role or r.session_id or r.content or r.more_pieces) for r in packed)
        assert _hits(packed) == _hits(single)
    assert _search(stub, object_key, "packed", 1000, limit=0) == []


def test_a_hit_too_large_for_a_response_comes_in_pieces_between_packed_ones(
    session: Any, stub: Any, object_key: str
) -> None:
    large = big_text(PIECE_BYTES + 200_000, "tail")  # "w w w … tail": it matches "w" too
    mid = big_text(PACK_BYTES // 2 + 1, "mid")
    session.append_messages(
        [text_message("a", "w small a"), text_message("big", large), text_message("b", "w small b")]
        + [text_message(f"mid{i}", mid) for i in range(3)]
    )
    single = _hits(_search(stub, object_key, "w", 0))
    packed_responses = _search(stub, object_key, "w", 1000)
    packed = _hits(packed_responses)
    assert [hit[:3] for hit in packed] == [hit[:3] for hit in single]
    assert all(same_text(p[3], s[3]) for p, s in zip(packed, single, strict=True))
    assert same_text(dict((hit[0], hit[3]) for hit in packed)["big"], large)
    in_pieces = False
    for response in packed_responses:
        text_bytes = sum(len(hit.content.encode()) for hit in response.hits)
        if in_pieces or any(hit.more_pieces for hit in response.hits):
            assert len(response.hits) == 1  # every piece travels alone, the last one too
            assert text_bytes <= PIECE_BYTES
        else:
            # Whole hits stop a response at about PACK_BYTES: the first hit always goes in.
            assert len(response.hits) == 1 or text_bytes <= PACK_BYTES
        in_pieces = response.hits[-1].more_pieces
    assert sum(1 for response in packed_responses if response.hits[0].more_pieces) == 1  # "big": two pieces


def _record_searches(monkeypatch: pytest.MonkeyPatch, stub: Any) -> list[pb.SearchMessagesRequest]:
    requests: list[pb.SearchMessagesRequest] = []
    search = stub.SearchMessages

    def recorded(request: pb.SearchMessagesRequest, *args: Any, **kwargs: Any) -> Any:
        requests.append(request)
        return search(request, *args, **kwargs)

    monkeypatch.setattr(stub, "SearchMessages", recorded)
    return requests


def test_the_python_clients_ask_for_packed_hits(
    session: Any, stub: Any, live_server: Any, object_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions_client.aio import SessionsClient

    session.append_messages([text_message(f"c{i}", f"client {i}") for i in range(30)])
    expected = _hits(_search(stub, object_key, "client", 0, limit=25))
    requests = _record_searches(monkeypatch, session._client._stub)
    hits = session.search("client", limit=25)
    assert [(hit.id, hit.role, hit.session_id, hit.content) for hit in hits] == expected
    assert len(hits) == 25

    async def scenario() -> tuple[list[str], list[pb.SearchMessagesRequest]]:
        async with SessionsClient(live_server.address) as client:
            aio_session = client.object(object_key).session()
            aio_requests = _record_searches(monkeypatch, aio_session._client._stub)
            return [hit.id for hit in await aio_session.search("client", limit=25)], aio_requests

    aio_ids, aio_requests = asyncio.run(scenario())
    assert aio_ids == [hit.id for hit in hits]
    assert len(requests) == len(aio_requests) == 1
    assert requests[0].max_hits_per_response > 1 and aio_requests[0].max_hits_per_response > 1
