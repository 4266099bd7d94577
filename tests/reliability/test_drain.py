"""Graceful drain under load: SIGTERM while clients append, stream history and subscribe.

Load: writer threads append (small and 1 MB messages) to several objects, reader threads stream
a ~10 MB history over and over, one Subscribe stream and one health Watch stream are open, and
two calls are deliberately held in flight across the SIGTERM: an UploadMessage whose last piece
is sent only once the drain has begun, and a StreamHistory whose reader pauses until the test has
made a new call and a health check during the drain.

Expected (DESIGN: health NOT_SERVING first, refuse new calls, let calls in flight finish):
- the health Watch reports NOT_SERVING while the process is still alive, Check never says
  SERVING again afterwards; while a call is in flight the port stays open, so a new connection's
  Check says NOT_SERVING and its new call gets UNAVAILABLE with reason DRAINING (which clients
  retry whatever the method), not a refused connection;
- the held upload completes OK and is stored; every append answered OK is stored (checked after
  a restart); appends refused with DRAINING are not stored; nothing is answered INTERNAL/UNKNOWN;
- every history stream completes or ends with UNAVAILABLE/CANCELLED (what clients treat as
  "reconnect"); the Subscribe stream ends with UNAVAILABLE;
- the process exits 0.
A `DRAIN SUMMARY` line gives the figures.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessions_client import SessionsClient, SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.reliability.support import NOT_SERVING, SERVING, Server, canonical, routing, stored_json, wait_until

DRAIN_SECONDS = 8
HISTORY_KEY = "drain-history"
UPLOAD_KEY = "drain-upload"
WRITE_KEYS = [f"drain-write-{i}" for i in range(3)]
RECONNECT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
CLIENT_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def _message(message_id: str, size: int) -> str:
    unit = f"{message_id} drain test text "
    return canonical(
        {"id": message_id, "role": "user", "parts": [{"type": "text", "text": (unit * (size // len(unit) + 1))[:size]}]}
    )


@dataclass
class Observed:
    lock: threading.Lock = field(default_factory=threading.Lock)
    appends: list[tuple[str, str, str, float, float, str]] = field(
        default_factory=list
    )  # key, session, id, t0, t1, outcome
    history_outcomes: Counter[str] = field(default_factory=Counter)
    history_reads: int = 0
    wrong: list[str] = field(default_factory=list)
    # (when the check was sent, its answer): a check sent after the watch's NOT_SERVING arrived
    # reached the server after the switch. Stamped as its answer arrived, one answered SERVING
    # just before the switch could be stamped after the watcher's thread stamped NOT_SERVING.
    health_checks: list[tuple[float, str]] = field(default_factory=list)
    watch: list[tuple[float, int]] = field(default_factory=list)
    watch_end: str = ""
    subscribe_end: tuple[str, str] = ("", "")
    subscribe_ready: threading.Event = field(default_factory=threading.Event)


def _code_and_reason(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    exc = SessionsError.from_rpc_error(error)
    return exc.code, exc.reason or ""


@pytest.mark.timeout(240)
def test_sigterm_under_load_drains_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir, "--drain-seconds", str(DRAIN_SECONDS), "--progress-seconds", "0.2").start()
    address = server.address
    seen = Observed()
    stop = threading.Event()  # the writers/readers stop once the server is gone
    drain_started = threading.Event()  # set once the Watch reported NOT_SERVING
    drain_checked = threading.Event()  # set once the test made its calls during the drain
    term_sent = threading.Event()
    term_time = [0.0]

    with SessionsClient(address, timeout=60) as client:
        history = client.object(HISTORY_KEY).session()
        for index in range(50):
            history.append_message(_message(f"h{index}", 200_000))  # ~10 MB of history

    def writer(worker: int) -> None:
        key = WRITE_KEYS[worker % len(WRITE_KEYS)]
        session_id = f"w{worker}"
        with SessionsClient(address, timeout=60, options=CLIENT_OPTIONS) as writer_client:
            session = writer_client.object(key).session(session_id)
            index = 0
            while not stop.is_set():
                message_id = f"w{worker}-{index}"
                size = 1_000_000 if index % 7 == 3 else 300
                index += 1
                started = time.monotonic()
                try:
                    session.append_message(_message(message_id, size))
                    outcome = "OK"
                except SessionsError as exc:
                    outcome = f"{exc.code.name}/{exc.reason or ''}"
                    if exc.code not in RECONNECT:
                        offset = started - term_time[0] if term_sent.is_set() else float("nan")
                        with seen.lock:
                            seen.wrong.append(
                                f"append {key}/{session_id}/{message_id} ({size} bytes, started {offset:+.3f}s "
                                f"after SIGTERM, answered after {time.monotonic() - started:.3f}s): {exc!r}"
                            )
                with seen.lock:
                    seen.appends.append((key, session_id, message_id, started, time.monotonic(), outcome))
                if outcome != "OK" and term_sent.is_set():
                    return

    def reader() -> None:
        with grpc.insecure_channel(address, options=CLIENT_OPTIONS) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            while not stop.is_set():
                request = pb.StreamHistoryRequest(object_key=HISTORY_KEY)
                try:
                    for _ in stub.StreamHistory(request, metadata=routing(HISTORY_KEY), timeout=60):
                        pass
                    outcome = "OK"
                except grpc.RpcError as error:
                    code, reason = _code_and_reason(error)
                    outcome = f"{code.name}/{reason}"
                    if code not in RECONNECT:
                        with seen.lock:
                            seen.wrong.append(f"StreamHistory: {outcome} {error.details()}")
                with seen.lock:
                    seen.history_outcomes[outcome] += 1
                    seen.history_reads += 1
                if outcome != "OK" and term_sent.is_set():
                    return

    held_history: dict[str, str] = {}

    def held_history_reader() -> None:
        """Reads one frame, then pauses until the test has made its calls during the drain
        (holding the drain open meanwhile), then reads on."""
        with grpc.insecure_channel(address, options=CLIENT_OPTIONS) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            call = stub.StreamHistory(
                pb.StreamHistoryRequest(object_key=HISTORY_KEY), metadata=routing(HISTORY_KEY), timeout=120
            )
            try:
                next(call)
                held_history["started"] = "yes"
                drain_checked.wait(timeout=60)
                for _ in call:
                    pass
                held_history["end"] = "OK"
            except grpc.RpcError as error:
                code, reason = _code_and_reason(error)
                held_history["end"] = f"{code.name}/{reason}"

    upload: dict[str, object] = {}
    upload_text = _message("held-upload", 3_500_000)  # > 3 MiB: the client streams it in pieces

    def held_upload() -> None:
        """An UploadMessage whose last piece is sent only after the drain has begun."""
        cut = len(upload_text) // 2

        def frames():  # type: ignore[no-untyped-def]
            header = pb.UploadHeader(object_key=UPLOAD_KEY, operation=pb.UPLOAD_OPERATION_APPEND)
            yield pb.UploadMessageRequest(header=header, json_piece=upload_text[:cut])
            upload["first_sent"] = time.monotonic()
            drain_started.wait(timeout=60)
            upload["last_sent"] = time.monotonic()
            yield pb.UploadMessageRequest(json_piece=upload_text[cut:])

        with grpc.insecure_channel(address, options=CLIENT_OPTIONS) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            try:
                response = stub.UploadMessage(frames(), metadata=routing(UPLOAD_KEY), timeout=120)
                upload["end"] = "OK"
                upload["inserted"] = response.inserted
            except grpc.RpcError as error:
                code, reason = _code_and_reason(error)
                upload["end"] = f"{code.name}/{reason}: {error.details()}"

    def subscriber() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            call = stub.Subscribe(
                pb.SubscribeRequest(object_key=WRITE_KEYS[0]), metadata=routing(WRITE_KEYS[0]), timeout=120
            )
            try:
                for _ in call:
                    seen.subscribe_ready.set()
                seen.subscribe_end = ("OK", "")
            except grpc.RpcError as error:
                code, reason = _code_and_reason(error)
                seen.subscribe_end = (code.name, reason)

    def watcher() -> None:
        with grpc.insecure_channel(address) as channel:
            call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=120)
            try:
                for response in call:
                    seen.watch.append((time.monotonic(), response.status))
                    if response.status == NOT_SERVING:
                        drain_started.set()
                        call.cancel()  # seen; do not hold the drain open
                        break
                seen.watch_end = "NOT_SERVING seen"
            except grpc.RpcError as error:
                seen.watch_end = f"{error.code().name}: {error.details()}"

    def health_poller() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                    label = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                except grpc.RpcError as error:
                    label = error.code().name
                seen.health_checks.append((sent, label))
                if (
                    label != "SERVING"
                    and term_sent.is_set()
                    and server.proc is not None
                    and server.proc.poll() is not None
                ):
                    return
                time.sleep(0.01)  # polling interval, not synchronisation

    threads = [threading.Thread(target=writer, args=(w,), name=f"drain-writer-{w}") for w in range(4)]
    threads += [threading.Thread(target=reader, name=f"drain-reader-{r}") for r in range(2)]
    threads += [
        threading.Thread(target=held_history_reader, name="held-history"),
        threading.Thread(target=held_upload, name="held-upload"),
        threading.Thread(target=subscriber, name="subscriber"),
        threading.Thread(target=watcher, name="health-watch"),
        threading.Thread(target=health_poller, name="health-poll"),
    ]
    assert server.proc is not None
    proc = server.proc
    try:
        for thread in threads:
            thread.start()
        # Load is running when appends have been answered, a history read finished, the held
        # calls are open and the Subscribe and Watch streams are established.
        ready = wait_until(
            lambda: (
                sum(1 for a in seen.appends if a[5] == "OK") >= 20
                and seen.history_reads >= 1
                and "started" in held_history
                and "first_sent" in upload
                and seen.subscribe_ready.is_set()
                and bool(seen.watch)
            ),
            timeout=90,
        )
        assert ready, (
            f"load did not start: {len(seen.appends)} appends, {seen.history_reads} reads, {held_history}, {upload}"
        )
        assert seen.watch[0][1] == SERVING

        term_time[0] = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        term_sent.set()
        assert drain_started.wait(timeout=30), f"health Watch never reported NOT_SERVING: {seen.watch} {seen.watch_end}"
        assert proc.poll() is None, "the process exited before the held upload could finish"

        # A new connection during the drain (the held history stream is still in flight) is
        # told the server is draining.
        try:
            with grpc.insecure_channel(address) as channel:
                try:
                    pb_grpc.SessionServiceStub(channel).ListSessions(
                        pb.ListSessionsRequest(object_key=WRITE_KEYS[0]), metadata=routing(WRITE_KEYS[0]), timeout=10
                    )
                    new_call = "OK"
                except grpc.RpcError as error:
                    code, reason = _code_and_reason(error)
                    new_call = f"{code.name}/{reason}"
            with grpc.insecure_channel(address) as channel:
                try:
                    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                    check_during_drain = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
                except grpc.RpcError as error:
                    check_during_drain = f"{error.code().name}: {error.details()}"
        finally:
            drain_checked.set()
        exit_code = proc.wait(timeout=DRAIN_SECONDS + 60)
    finally:
        stop.set()
        drain_checked.set()
        for thread in threads:
            thread.join(timeout=120)
        server.stop()

    # Verify on a restarted server: acknowledged appends and the held upload are stored.
    restarted = Server(data_dir).start()
    try:
        channel = grpc.insecure_channel(restarted.address, options=CLIENT_OPTIONS)
        stub = pb_grpc.SessionServiceStub(channel)
        lost = [a for a in seen.appends if a[5] == "OK" and stored_json(stub, a[0], a[1], a[2]) is None]
        # Refused (DRAINING) or cancelled appends must not have been written: a cancelled one
        # that is stored was in flight and lost its answer instead of completing.
        refused_but_stored = [
            a
            for a in seen.appends
            if (a[5].endswith("/DRAINING") or a[5].startswith("CANCELLED"))
            and stored_json(stub, a[0], a[1], a[2]) is not None
        ]
        upload_stored = stored_json(stub, UPLOAD_KEY, "", "held-upload")
        channel.close()
    finally:
        restarted.signal(signal.SIGTERM)

    answered_ok = [a for a in seen.appends if a[5] == "OK"]
    during_drain = [a for a in answered_ok if a[3] < term_time[0] < a[4]]
    outcomes = Counter(a[5] for a in seen.appends)
    after_not_serving = [label for t, label in seen.health_checks if t > seen.watch[-1][0]]
    summary = (
        f"DRAIN SUMMARY exit={exit_code} appends={dict(outcomes)} "
        f"(answered OK across the SIGTERM: {len(during_drain)}) "
        f"held upload={upload.get('end')} held history={held_history.get('end')} "
        f"history streams={dict(seen.history_outcomes)} subscribe={seen.subscribe_end} "
        f"watch={[health_pb2.HealthCheckResponse.ServingStatus.Name(s) for _, s in seen.watch]} "
        f"checks after NOT_SERVING={dict(Counter(after_not_serving))} new call during drain={new_call} "
        f"check during drain={check_during_drain} "
        f"lost={len(lost)} refused-or-cancelled-but-stored={len(refused_but_stored)} wrong={len(seen.wrong)}"
    )
    with capsys.disabled():
        print("\n" + summary)

    assert exit_code == 0, f"exit {exit_code}:\n{server.output()[-3000:]}"
    assert upload.get("end") == "OK" and upload.get("inserted"), f"held upload: {upload.get('end')}"
    assert upload_stored == upload_text, "the upload answered OK during the drain is not stored intact"
    held_end = held_history.get("end", "no end")
    assert held_end == "OK" or held_end.split("/")[0] in {c.name for c in RECONNECT}, f"held history: {held_end}"
    assert seen.subscribe_end[0] == "UNAVAILABLE", f"Subscribe ended with {seen.subscribe_end}"
    assert "SERVING" not in after_not_serving, f"health said SERVING after NOT_SERVING: {seen.health_checks[-20:]}"
    assert new_call == "UNAVAILABLE/DRAINING", f"a new call during the drain was answered {new_call}"
    assert check_during_drain == "NOT_SERVING", f"a health check during the drain was answered {check_during_drain}"
    assert not seen.wrong, "\n".join(seen.wrong[:20])
    assert not lost, f"{len(lost)} acknowledged appends lost: {lost[:5]}"
    assert not refused_but_stored, f"appends answered DRAINING/CANCELLED but stored: {refused_but_stored[:5]}"
