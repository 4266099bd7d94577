"""A burst of concurrent calls larger than gRPC core's default queue (1,000 calls waiting for
the event loop) is served whole: none is dropped as CANCELLED, which no client retries."""

from __future__ import annotations

import collections

import grpc

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc

BURST = 3000  # dropped 475 of them with gRPC core's defaults (measured)


def test_a_burst_of_concurrent_calls_is_served_whole(stub: pb_grpc.SessionServiceStub) -> None:
    calls = [stub.GetObjectStats.future(pb.GetObjectStatsRequest(object_key=f"burst-{i % 7}")) for i in range(BURST)]
    outcomes: collections.Counter[str] = collections.Counter()
    for call in calls:
        try:
            call.result()
            outcomes["OK"] += 1
        except grpc.RpcError as exc:
            outcomes[exc.code().name] += 1
    assert outcomes == {"OK": BURST}
