"""Crash safety: SIGKILL the server at random moments under concurrent load, restart, repeat.

Each seed (env CRASH_SEEDS, default "1,2") gets a fresh data directory and CRASH_KILLS kill cycles
(default 3). In a cycle the server starts on the same directory, WRITERS client threads append to
OBJECTS objects x SESSIONS sessions:

- small text messages,
- multi-chunk messages (1.6-3.4 MB of JSON: two or three rows, some through UploadMessage),
- messages with an inline base64 image (`data:image/png;base64,...`, 200-400 KB, some reused so
  payload deduplication is exercised) that the server moves to the attachment tables,

and the process is SIGKILLed once a random number of appends (drawn from `random.Random(seed)`)
has been acknowledged, plus a random extra delay of up to 300 ms so the kill also lands inside
commits, checkpoints and uploads. Every append that returned is recorded (SHA-256 and length of
the exact JSON sent); appends that were in flight at the kill are recorded separately.

Afterwards the server restarts once more and every acknowledged write is read back with
GetMessage and compared byte for byte; an in-flight write may be absent, but if present it must
be exact too. Then, with the server killed again, every object file is checked offline: no torn
message (continuation rows exactly 1..content_chunks, no orphan chunk rows, every attachment
reference and pointer resolves to a complete payload whose bytes hash to its address),
`PRAGMA integrity_check` = ok.

Soak mode: CRASH_SOAK=1 runs CRASH_KILLS=25 cycles per seed over seeds 1..5 (unless CRASH_SEEDS
or CRASH_KILLS say otherwise) with 8 writers and more objects; expect several minutes.

The summary line printed at the end (`CRASH SUMMARY ...`) gives the figures to quote.
"""

from __future__ import annotations

import base64
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from tests.reliability.support import (
    Server,
    canonical,
    check_object_file,
    digest,
    object_files,
    stored_json,
)

pytestmark = pytest.mark.long  # about 60 s: started first (see tests/conftest.py)

SOAK = os.environ.get("CRASH_SOAK") == "1"
SEEDS = [int(s) for s in os.environ.get("CRASH_SEEDS", "1,2,3,4,5" if SOAK else "1,2").split(",") if s.strip()]
KILLS = int(os.environ.get("CRASH_KILLS", "25" if SOAK else "3"))
WRITERS = 8 if SOAK else 6
OBJECTS = 24 if SOAK else 8
SESSIONS = 3
ACKS_PER_CYCLE = (15, 120)  # a cycle is killed after this many acknowledged appends (random)
CALL_TIMEOUT_SECONDS = 120.0
CYCLE_DEADLINE_SECONDS = 90.0

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


@dataclass(frozen=True)
class Sent:
    """One append as sent: where, and the exact JSON (by digest and length)."""

    object_key: str
    session_id: str
    message_id: str
    sha256: str
    length: int
    kind: str


@dataclass
class Ledger:
    """Acknowledged and in-flight appends, shared by the writer threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acknowledged: list[Sent] = field(default_factory=list)
    in_flight: list[Sent] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    cycle_acks: int = 0


def _text(rng: random.Random, size: int) -> str:
    """ASCII text of `size` characters (random words, cheap to build at megabyte sizes)."""
    unit = " ".join(rng.choice(WORDS) for _ in range(64)) + f" {rng.getrandbits(64):x} "
    return (unit * (size // len(unit) + 1))[:size]


def _message(rng: random.Random, message_id: str, shared_images: list[str]) -> tuple[str, str]:
    """(kind, JSON text) of a random message. Only ASCII strings and canonical JSON, so the stored
    (and read back) form equals the text sent."""
    roll = rng.random()
    if roll < 0.68:
        kind = "small"
        parts: list[dict[str, str]] = [{"type": "text", "text": _text(rng, rng.randint(1, 4000))}]
    elif roll < 0.84:
        kind = "multi-chunk"
        parts = [{"type": "text", "text": _text(rng, rng.randint(1_600_000, 3_400_000))}]
    else:
        kind = "image"
        if shared_images and rng.random() < 0.3:
            image = rng.choice(shared_images)
        else:
            image = base64.b64encode(rng.randbytes(rng.randint(150_000, 300_000))).decode("ascii")
            if len(shared_images) < 4:
                shared_images.append(image)
        parts = [
            {"type": "text", "text": _text(rng, rng.randint(1, 300))},
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64," + image},
        ]
    role = rng.choice(("user", "assistant"))
    return kind, canonical({"id": message_id, "role": role, "parts": parts})


def _writer(
    address: str,
    seed: int,
    cycle: int,
    worker: int,
    ledger: Ledger,
    killed: threading.Event,
    progress: threading.Condition,
) -> None:
    rng = random.Random(f"{seed}/{cycle}/{worker}")
    shared_images: list[str] = []
    with SessionsClient(address, timeout=CALL_TIMEOUT_SECONDS) as client:
        for index in range(1_000_000):
            object_key = f"crash-{seed}-obj{rng.randrange(OBJECTS)}"
            session_id = f"s{rng.randrange(SESSIONS)}"
            message_id = f"c{cycle}-w{worker}-{index}"
            kind, text = _message(rng, message_id, shared_images)
            sent = Sent(object_key, session_id, message_id, digest(text), len(text), kind)
            try:
                result = client.object(object_key).session(session_id).append_message(text)
            except SessionsError as exc:
                with ledger.lock:
                    ledger.in_flight.append(sent)
                    if not killed.is_set():
                        ledger.unexpected.append(f"{message_id} ({kind}) failed before the kill: {exc}")
                return
            with ledger.lock:
                # An answer is an acknowledgement even if it arrives just after the kill signal.
                ledger.acknowledged.append(sent)
                ledger.cycle_acks += 1
                if not result.inserted:
                    ledger.unexpected.append(f"{message_id}: fresh id answered inserted=false")
            with progress:
                progress.notify_all()
            if killed.is_set():
                return


def _run_cycle(server: Server, seed: int, cycle: int, rng: random.Random, ledger: Ledger) -> int:
    """One load-and-kill cycle; returns the acknowledgements that triggered the kill."""
    killed = threading.Event()
    progress = threading.Condition()
    target = rng.randint(*ACKS_PER_CYCLE)
    extra_delay = rng.uniform(0.0, 0.3)
    with ledger.lock:
        ledger.cycle_acks = 0
    threads = [
        threading.Thread(
            target=_writer,
            args=(server.address, seed, cycle, worker, ledger, killed, progress),
            name=f"crash-writer-{worker}",
        )
        for worker in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + CYCLE_DEADLINE_SECONDS
    with progress:
        while ledger.cycle_acks < target and time.monotonic() < deadline and any(t.is_alive() for t in threads):
            progress.wait(timeout=0.5)
    # Not synchronisation: a random offset so the kill is not always right after an answer.
    time.sleep(extra_delay)
    killed.set()
    code = server.kill()
    assert code == -9, f"server exited with {code} before the kill:\n{server.output()[-4000:]}"
    for thread in threads:
        thread.join(timeout=CALL_TIMEOUT_SECONDS)
        assert not thread.is_alive(), "a writer hung after the server was killed"
    return ledger.cycle_acks


def _verify_reads(address: str, ledger: Ledger) -> tuple[int, list[str], list[str], int]:
    """(checked, lost, mismatched, in-flight present) through GetMessage on a restarted server."""
    lost: list[str] = []
    mismatched: list[str] = []
    present = 0
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    stub = pb_grpc.SessionServiceStub(channel)
    try:
        for sent in ledger.acknowledged:
            text = stored_json(stub, sent.object_key, sent.session_id, sent.message_id)
            name = f"{sent.object_key}/{sent.session_id}/{sent.message_id} ({sent.kind}, {sent.length} bytes)"
            if text is None:
                lost.append(name)
            elif len(text) != sent.length or digest(text) != sent.sha256:
                mismatched.append(f"{name}: read back {len(text)} bytes that differ")
        for sent in ledger.in_flight:
            text = stored_json(stub, sent.object_key, sent.session_id, sent.message_id)
            if text is not None:
                present += 1
                if len(text) != sent.length or digest(text) != sent.sha256:
                    mismatched.append(f"in-flight {sent.object_key}/{sent.session_id}/{sent.message_id} differs")
    finally:
        channel.close()
    return len(ledger.acknowledged), lost, mismatched, present


@pytest.mark.timeout(1800 if SOAK else 300)
def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    totals = {"runs": 0, "kills": 0, "checked": 0, "lost": 0, "mismatched": 0, "torn": 0, "integrity": 0}
    totals |= {"in_flight": 0, "in_flight_present": 0, "files": 0, "kinds": {}}  # type: ignore[dict-item]
    failures: list[str] = []
    started = time.monotonic()
    for seed in SEEDS:
        rng = random.Random(seed)
        data_dir = tmp_path / f"seed-{seed}"
        ledger = Ledger()
        for cycle in range(KILLS):
            server = Server(data_dir).start()
            try:
                _run_cycle(server, seed, cycle, rng, ledger)
            finally:
                server.stop()
            totals["kills"] += 1
        assert not ledger.unexpected, "errors before any kill:\n" + "\n".join(ledger.unexpected[:20])

        # Restart on the crashed directory; every acknowledged write must read back exactly.
        server = Server(data_dir).start()
        try:
            checked, lost, mismatched, present = _verify_reads(server.address, ledger)
        finally:
            server.kill()  # leave the files as a crash does: WAL not checkpointed
        reports = [check_object_file(path, readonly=False) for path in object_files(data_dir)]
        torn = [problem for report in reports for problem in report.torn]
        bad_integrity = [f"{r.path.name}: {r.integrity}" for r in reports if r.integrity != "ok"]

        totals["runs"] += 1
        totals["checked"] += checked
        totals["lost"] += len(lost)
        totals["mismatched"] += len(mismatched)
        totals["torn"] += len(torn)
        totals["integrity"] += len(bad_integrity)
        totals["in_flight"] += len(ledger.in_flight)
        totals["in_flight_present"] += present
        totals["files"] += len(reports)
        kinds: dict[str, int] = totals["kinds"]  # type: ignore[assignment]
        for sent in ledger.acknowledged:
            kinds[sent.kind] = kinds.get(sent.kind, 0) + 1
        for label, problems in (
            ("lost", lost),
            ("mismatched", mismatched),
            ("torn", torn),
            ("integrity", bad_integrity),
        ):
            if problems:
                failures.append(f"seed {seed}: {len(problems)} {label}:\n  " + "\n  ".join(problems[:20]))
        assert len(reports) >= 1, "no object files were written"

    summary = (
        f"CRASH SUMMARY seeds={SEEDS} runs x kills={totals['runs']} x {KILLS} (kills={totals['kills']}) "
        f"acknowledged writes checked={totals['checked']} {totals['kinds']} lost={totals['lost']} "
        f"mismatched={totals['mismatched']} torn={totals['torn']} integrity failures={totals['integrity']} "
        f"files={totals['files']} in-flight at kill={totals['in_flight']} (present after restart "
        f"{totals['in_flight_present']}) elapsed={time.monotonic() - started:.0f}s"
    )
    with capsys.disabled():
        print("\n" + summary)
    assert not failures, summary + "\n" + "\n".join(failures)


def test_the_torn_row_checker_sees_tears(tmp_path: Path) -> None:
    """The offline checker used above is not vacuous: damage of each kind it looks for is found."""
    import shutil
    import sqlite3

    from sessions_server.storage.paths import object_path
    from tests.conftest import start_server

    server = start_server(tmp_path / "data")
    try:
        with SessionsClient(server.address) as client:
            session = client.object("checked").session()
            image = {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64," + "aWlp" * 1000}
            texts = [
                canonical({"id": "a", "role": "user", "parts": [{"type": "text", "text": "root"}]}),
                canonical({"id": "b", "role": "assistant", "parts": [{"type": "text", "text": "t" * 2_000_000}]}),
                canonical({"id": "c", "role": "user", "parts": [image]}),
            ]
            for text in texts:
                session.append_message(text)
    finally:
        server.stop()
    source = object_path(tmp_path / "data", "checked")
    clean = check_object_file(source)
    assert clean.integrity == "ok" and not clean.torn and clean.continuation_rows == 1 and clean.attachments == 1

    damage = {
        "continuation": "DELETE FROM cf_agents_session_message_chunks WHERE id = 'b'",
        "orphan chunk": "INSERT INTO cf_agents_session_message_chunks VALUES ('', 'ghost', 1, 'x')",
        "payload chunk": "DELETE FROM cf_agents_session_attachment_chunks",
        "payload meta": "DELETE FROM cf_agents_session_attachment_meta",
        "reference": "DELETE FROM cf_agents_session_attachment_refs",
        "parent": "DELETE FROM cf_agents_session_messages WHERE id = 'a'",
        "content": "UPDATE cf_agents_session_messages SET content = substr(content, 1, 10) WHERE id = 'a'",
    }
    for label, statement in damage.items():
        copy = tmp_path / f"{label.replace(' ', '-')}.sqlite"
        shutil.copyfile(source, copy)
        conn = sqlite3.connect(copy)
        conn.execute(statement)
        conn.commit()
        conn.close()
        assert check_object_file(copy).torn, f"damage to the {label} went unnoticed"
