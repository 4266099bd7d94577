"""Clients whose deadlines pass mid-stream leave no ERROR lines in the server's log.

A deadline can pass at any point of a server stream: while its first response is being sent,
between its last response and its status. gRPC then refuses the call's remaining sends; the
server must end the call quietly rather than log a traceback that would page someone. The race
is narrow, so the test makes thousands of calls with deadlines of about a millisecond from
several threads (before the fix, 6,000 such calls logged 16 ERROR lines here).
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import grpc

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc
from tests.reliability.support import Server, routing
from tests.service.support import text_message

KEY = "deadlines"
THREADS = 4
CALLS_PER_THREAD = 750


def _tight_deadline_reads(address: str, seed: int, outcomes: dict[str, int], lock: threading.Lock) -> None:
    chooser = random.Random(seed)
    # A channel of its own per thread: gRPC would otherwise share one connection among them.
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = sessions_pb2_grpc.SessionServiceStub(channel)
        for _ in range(CALLS_PER_THREAD):
            request = pb.GetRecentHistoryRequest(
                object_key=KEY, max_content_bytes=chooser.choice([2_000, 50_000, 800_000])
            )
            try:
                list(stub.GetRecentHistory(request, metadata=routing(KEY), timeout=chooser.uniform(0.0005, 0.005)))
                outcome = "OK"
            except grpc.RpcError as exc:
                outcome = exc.code().name
            with lock:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1


def test_reads_cut_short_by_their_deadlines_log_no_errors(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = sessions_pb2_grpc.SessionServiceStub(channel)
            items = [pb.AppendItem(message_json=json.dumps(text_message(f"m{i}", "x" * 2_000))) for i in range(400)]
            for start in range(0, len(items), 100):
                stub.AppendMessages(
                    pb.AppendMessagesRequest(object_key=KEY, items=items[start : start + 100]), metadata=routing(KEY)
                )
        outcomes: dict[str, int] = {}
        lock = threading.Lock()
        threads = [
            threading.Thread(target=_tight_deadline_reads, args=(server.address, seed, outcomes, lock))
            for seed in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        log = server.output()
        assert server.alive(), log
    finally:
        server.stop()

    # Both endings happened: calls that finished and calls their deadlines cut short.
    assert outcomes.get("OK", 0) > 0 and outcomes.get("DEADLINE_EXCEEDED", 0) > 0, outcomes
    assert set(outcomes) <= {"OK", "DEADLINE_EXCEEDED"}, outcomes
    assert " ERROR " not in log and "Traceback" not in log, log
