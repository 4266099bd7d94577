"""The change feed across a crash (issue 8): a subscriber of a server that is SIGKILLed and
restarted on the same data directory resumes from its last revision, is told with a `reset` that
events may have been missed (the retained events died with the process), and then receives new
writes live. No silent gap.
"""

from __future__ import annotations

import signal

import grpc

from sessions_client import SessionsClient, SessionsError
from tests.e2e.conftest import ServerProcess
from tests.service.test_feed import Feed


def message(message_id: str) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]}


def test_resume_after_sigkill_and_restart_starts_with_reset_then_goes_live(server_process: ServerProcess) -> None:
    key = "feed-restart"
    feed = Feed(server_process.address, key, reconnect_attempts=0)
    try:
        with SessionsClient(server_process.address) as client:
            session = client.object(key).session()
            session.append_messages([message("a"), message("b")])
            session.append_message(message("c"))
        events = feed.take(3)
        assert [e.message and e.message["id"] for e in events] == ["a", "b", "c"]
        last = events[-1].revision

        assert server_process.signal(signal.SIGKILL) == -signal.SIGKILL

        error = feed.get()
        assert isinstance(error, SessionsError), error
        assert error.code == grpc.StatusCode.UNAVAILABLE  # the client's cue to reconnect
    finally:
        feed.close()

    restarted = ServerProcess(server_process.data_dir).start()
    resumed: Feed | None = None
    try:
        assert restarted.address != ""
        resumed = Feed(restarted.address, key, resume_from=last, reconnect_attempts=0)
        reset = resumed.next()
        assert reset.type == "reset", reset
        assert reset.error

        with SessionsClient(restarted.address) as client:
            session = client.object(key).session()
            assert [m["id"] for m in session.get_history()] == ["a", "b", "c"]
            session.append_message(message("d"))
            session.delete_messages(["a"])
        live = resumed.take(2)
        assert [(e.type, e.message and e.message["id"]) for e in live] == [("append", "d"), ("delete", None)]
        assert live[1].message_ids == ("a",)
        assert reset.revision < live[0].revision < live[1].revision
        # Revisions keep increasing across the restart, so an old resume point is never mistaken
        # for a new one.
        assert live[0].revision > last
    finally:
        if resumed is not None:
            resumed.close()
        restarted.stop()


def test_the_client_reconnects_by_itself_when_the_server_comes_back_on_its_address(
    server_process: ServerProcess,
) -> None:
    """With the default reconnect policy, `subscribe()` survives the crash: it resumes from the
    last revision it delivered, surfaces the `reset`, and continues live."""
    key = "feed-reconnect"
    address = server_process.address
    feed = Feed(address, key, reconnect_attempts=20)
    restarted: ServerProcess | None = None
    try:
        with SessionsClient(address) as client:
            client.object(key).session().append_message(message("before"))
        before = feed.next()
        assert before.message is not None and before.message["id"] == "before"

        assert server_process.signal(signal.SIGKILL) == -signal.SIGKILL
        restarted = ServerProcess(server_process.data_dir, "--listen", address).start()
        assert restarted.address == address

        reset = feed.next()
        assert reset.type == "reset", reset
        with SessionsClient(address) as client:
            client.object(key).session().append_message(message("after"))
        after = feed.next()
        assert (after.type, after.message and after.message["id"]) == ("append", "after")
        assert after.revision > before.revision
    finally:
        feed.close()
        if restarted is not None:
            restarted.stop()
