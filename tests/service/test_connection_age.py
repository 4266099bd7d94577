"""--max-connection-age-seconds: a connection that old is asked to go, and one whose calls
outlast the grace is closed under them, so that a client CA taken out of --tls-client-ca (or a
new server behind a TCP load balancer) reaches clients that stay connected, change feeds
included. Without it a connection lasted as long as its client kept it."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.conftest import start_server
from tests.service.support import stream_opens

AGE = 0.3
GRACE = 0.3
MESSAGE = {"id": "m", "role": "user", "parts": [{"type": "text", "text": "hello"}]}


def test_a_change_feed_outliving_the_age_and_its_grace_is_closed_unavailable(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", max_connection_age_seconds=AGE, max_connection_age_grace_seconds=GRACE)
    try:
        with grpc.insecure_channel(server.address) as channel:
            feed = pb_grpc.SessionServiceStub(channel).Subscribe(
                pb.SubscribeRequest(object_key="k"), metadata=[("x-object-key", "k")], timeout=30
            )
            with pytest.raises(grpc.RpcError) as closed:
                for _ in feed:  # the PROGRESS that opens it, then nothing until the connection goes
                    pass
            # A feed that nothing ends would run into its 30 s deadline instead.
            assert closed.value.code() == grpc.StatusCode.UNAVAILABLE, closed.value  # type: ignore[attr-defined]
    finally:
        server.stop()


def test_calls_and_a_subscription_go_on_across_connections_as_they_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients take the GOAWAY for what it is: new calls go on a new connection, a call the
    old one refused is tried again, and the subscription resumes after the last revision it saw:
    every append arrives once, in order."""
    server = start_server(tmp_path / "data", max_connection_age_seconds=AGE, max_connection_age_grace_seconds=GRACE)
    try:
        with SessionsClient(server.address) as client:
            opened = stream_opens(client, monkeypatch)
            session = client.object("k").session()
            feed = client.object("k").subscribe(include_progress=True, reconnect_attempts=3)
            assert next(feed).type == "progress"  # open: it sees every append from here
            appended: list[str] = []
            started = time.monotonic()
            # Past several ages and graces: each connection is replaced at least twice.
            while time.monotonic() - started < 4 * (AGE * 1.1 + GRACE) or len(appended) < 20:
                message = {**MESSAGE, "id": f"m{len(appended)}"}
                # One cut by a closing connection after its commit is tried again: stored once,
                # answered then as a duplicate, so whether it inserted is not asserted.
                session.append_message(message)
                appended.append(message["id"])
            seen: list[str] = []
            while len(seen) < len(appended):
                event = next(feed)
                if event.type != "progress":
                    assert event.type == "append" and event.message is not None, event
                    seen.append(event.message["id"])
            feed.close()
            assert seen == appended
            assert opened.count("Subscribe") >= 2, opened  # it was cut and resumed
            assert [m["id"] for m in session.get_history()] == appended
    finally:
        server.stop()
