"""Disk full and I/O errors: a write that cannot be stored fails cleanly and leaves no trace.

Two ways to run out of space, both without touching the host's real disk:

- `tmpfs`: a 32 MiB tmpfs is mounted over the data directory (we run as root); the test fills it
  with a filler file leaving a little slack, so growing a WAL fails with ENOSPC (SQLITE_FULL).
  If the mount is refused (no privileges in this environment), this variant fails and says
  why: the file size limit below is no full disk (EFBIG, not ENOSPC), so it is no stand-in.
- `rlimit`: the server process runs with SIGXFSZ ignored and, once seeded, gets
  RLIMIT_FSIZE = (largest file in the data directory + slack) through prlimit(2), so writing past
  it fails with EFBIG (SQLite reports a disk I/O error, or SQLITE_FULL for a short write).
  "Freeing space" raises the limit again.

Accepted answers for a write that hits the wall: RESOURCE_EXHAUSTED with reason STORAGE_FULL,
or UNAVAILABLE with reason STORAGE_FAILURE. The statuses seen are printed (`DISK FULL ...`).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sessions_client import ImportItem, SessionsClient, SessionsError
from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.domain.scratch_room import FREE_MARGIN_BYTES, ScratchRoom
from sessions_server.storage.datadir import SCRATCH_DIR_NAME
from sessions_server.storage.files import free_bytes
from sessions_server.storage.paths import object_path
from tests.reliability.support import (
    SERVING,
    Server,
    canonical,
    check_object_file,
    health_status,
    open_file,
    routing,
    stored_json,
    table_dump,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TMPFS_BYTES = 32 * 1024 * 1024
SLACK_BYTES = 256 * 1024
ACCEPTED = {
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "STORAGE_FULL"),
    (grpc.StatusCode.UNAVAILABLE, "STORAGE_FAILURE"),
}


# Run in the server's process before it starts (`Server(setup=...)`): writing past RLIMIT_FSIZE
# must fail with EFBIG, not kill the server.
IGNORE_SIGXFSZ = "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)"


@dataclass
class LimitedStorage:
    """A data directory whose space can be exhausted and freed while a server uses it."""

    mode: str
    data_dir: Path
    mount_point: Path | None = None
    filler: Path | None = None
    pid: int | None = None
    setup: str = IGNORE_SIGXFSZ

    def exhaust(self, pid: int | None = None, room: int = SLACK_BYTES) -> None:
        """Leaves about `room` bytes free (tmpfs), or caps file growth at the largest current
        file plus `room` (rlimit, applied to `pid`, default the server process)."""
        if self.mode == "tmpfs":
            assert self.mount_point is not None
            self.filler = self.mount_point / "filler"
            block = b"\0" * (64 * 1024)
            with self.filler.open("wb", buffering=0) as out:  # nothing left to flush on close
                try:
                    while True:
                        out.write(block)
                        out.flush()
                except OSError:
                    pass
            size = self.filler.stat().st_size
            os.truncate(self.filler, max(0, size - room))
            return
        self.pid = pid if pid is not None else self.pid
        largest = max((p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file()), default=0)
        resource.prlimit(self.pid or os.getpid(), resource.RLIMIT_FSIZE, (largest + room, resource.RLIM_INFINITY))

    def free(self) -> None:
        if self.mode == "tmpfs":
            if self.filler is not None:
                self.filler.unlink(missing_ok=True)
            return
        with contextlib.suppress(ProcessLookupError):
            resource.prlimit(self.pid or os.getpid(), resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)


@pytest.fixture(params=["tmpfs", "rlimit"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LimitedStorage]:
    if request.param == "tmpfs":
        mount_point = tmp_path / "mnt"
        mount_point.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount_point)],
                capture_output=True,
                text=True,
            )
        except OSError as exc:  # no mount(8) here
            done = subprocess.CompletedProcess([], 1, "", str(exc))
        if done.returncode == 0:
            try:
                yield LimitedStorage("tmpfs", mount_point / "data", mount_point=mount_point)
            finally:
                if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
                    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
            return
        # A failure, not a skip or a quiet fallback to the file size limit: without the mount a full
        # disk (ENOSPC, SQLITE_FULL) would not be tested at all. `make test` runs as root in CI.
        pytest.fail(
            "a full disk is tested on a 32 MiB tmpfs, and mount was refused "
            f"({(done.stderr or done.stdout).strip()}): run the suite as root, or where mount(8) may mount a tmpfs"
        )
    yield LimitedStorage("rlimit", tmp_path / "data")


def _text_message(message_id: str, size: int, role: str = "user") -> str:
    unit = f"{message_id} lorem ipsum dolor sit amet "
    return canonical(
        {"id": message_id, "role": role, "parts": [{"type": "text", "text": (unit * (size // len(unit) + 1))[:size]}]}
    )


def _image_message(message_id: str, payload: bytes) -> str:
    url = "data:image/png;base64," + base64.b64encode(payload).decode("ascii")
    parts = [{"type": "text", "text": "see image"}, {"type": "file", "mediaType": "image/png", "url": url}]
    return canonical({"id": message_id, "role": "user", "parts": parts})


def _status(exc: SessionsError) -> tuple[grpc.StatusCode, str | None]:
    return exc.code, exc.reason


def test_full_storage_fails_the_write_cleanly_and_keeps_serving_reads(
    storage: LimitedStorage, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "disk-full"
    server = Server(storage.data_dir, setup=storage.setup).start()
    seen: list[str] = []
    try:
        with SessionsClient(server.address, timeout=60) as client:
            session = client.object(key).session()
            image = os.urandom(300_000)
            committed = [_text_message(f"m{i}", 500 + 37 * i) for i in range(20)]
            committed.append(_text_message("multi", 2_000_000, role="assistant"))  # two rows
            committed.append(_image_message("pic", image))  # an attachment
            for text in committed:
                assert session.append_message(text).inserted
            path = object_path(storage.data_dir, key)
            before = table_dump(path)

            storage.exhaust(server.pid)

            # Each of these needs far more than the slack; each must fail and leave no trace.
            attempts: list[tuple[str, Callable[[], object]]] = [
                ("append 8 MB (UploadMessage)", lambda: session.append_message(_text_message("big", 8_000_000))),
                ("append 2.9 MB (unary)", lambda: session.append_message(_text_message("mid", 2_900_000))),
                (
                    "append_messages [small, 2 MB]",
                    lambda: session.append_messages([_text_message("b1", 100), _text_message("b2", 2_000_000)]),
                ),
                ("append 1.2 MB image", lambda: session.append_message(_image_message("pic2", os.urandom(1_200_000)))),
                ("update m5 to 8 MB", lambda: session.update_message(_text_message("m5", 8_000_000))),
                (
                    "import 3 MB (ImportMessages)",
                    lambda: session.import_messages([ImportItem(_text_message("imp", 3_000_000), "m19", 1)]),
                ),
            ]
            for label, attempt in attempts:
                with pytest.raises(SessionsError) as failure:
                    attempt()
                status = _status(failure.value)
                seen.append(f"{label} -> {status[0].name}/{status[1]}: {failure.value.message}")
                assert status in ACCEPTED, f"{label}: {failure.value}"
                assert table_dump(path) == before, f"{label}: the failed write changed the object's rows"

            # Reads keep working and show exactly what was committed.
            assert health_status(server.address) == SERVING
            assert session.get_history() == [json.loads(t) for t in committed]
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.SessionServiceStub(channel)
                for text in committed:
                    assert stored_json(stub, key, "", json.loads(text)["id"]) == text
            attachment = client.object(key).read_attachment(hashlib.sha256(image).hexdigest())
            assert attachment.data == image
            assert client.object(key).get_object_stats().message_rows == len(committed)
            assert session.get_message("big") is None and session.get_message("b1") is None
            assert session.get_message("imp") is None

            storage.free()

            # Space is back: the same writes now succeed.
            big = _text_message("big", 8_000_000)
            assert session.append_message(big).inserted
            assert session.append_messages([_text_message("b1", 100), _text_message("b2", 2_000_000)])[1].inserted
            assert session.update_message(_text_message("m5", 8_000_000)) is not None
            ids = [m["id"] for m in session.get_history()]
            assert ids == [json.loads(t)["id"] for t in committed] + ["big", "b1", "b2"]
        assert server.signal(signal.SIGTERM) == 0
    finally:
        server.stop()
        storage.free()
    report = check_object_file(object_path(storage.data_dir, key), readonly=False)
    assert report.integrity == "ok" and not report.torn, (report.integrity, report.torn)
    with capsys.disabled():
        print(f"\nDISK FULL [{storage.mode}]:")
        for line in seen:
            print(f"  {line}")


GROUP_CALL_TIMEOUT_SECONDS = 10.0
BUSY_CALL_TIMEOUT_SECONDS = 20.0


def group_commit_child(data_dir: str, mode: str, mount_point: str, tail_bytes: str) -> None:
    """Runs in a child process: one write batch [A small, B 8 MB, C `tail_bytes`, D small]
    against a full disk, through the domain service so the four jobs share one transaction;
    then space is freed and one more append is tried. Prints what each call answered as JSON
    ("hung" when no answer came within GROUP_CALL_TIMEOUT_SECONDS)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from sessions_server.domain.service import SessionsService
    from sessions_server.storage.registry import ObjectRegistry
    from sessions_server.storage.rows import Parent

    storage = LimitedStorage(mode, Path(data_dir), mount_point=Path(mount_point) if mount_point else None)
    # The domain service on its own loop, without a gRPC server: the file-size limit applies to
    # the whole process, and gRPC's own threads are not what this test is about.
    loop = asyncio.new_event_loop()
    service = SessionsService(ObjectRegistry(Path(data_dir), ThreadPoolExecutor(max_workers=4)))

    def run(coro: object) -> object:
        return loop.run_until_complete(coro)  # type: ignore[arg-type]

    async def one(message_id: str, size: int) -> dict[str, object]:
        text = _text_message(message_id, size)
        try:
            call = service.append("group", "s", text, Parent.auto(), from_client=False)
            result = await asyncio.wait_for(call, GROUP_CALL_TIMEOUT_SECONDS)
            return {"id": message_id, "ok": True, "parent": result.message.info.parent_id}
        except TimeoutError:
            return {"id": message_id, "ok": False, "hung": True, "error": "no answer (hung)"}
        except Exception as exc:  # reported to the parent test
            return {"id": message_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"}

    async def batch() -> list[dict[str, object]]:
        # Created in one loop step: the first write starts the writer task, which runs after
        # all four jobs are queued, so they form one batch (one transaction, four savepoints).
        sizes = (("A", 100), ("B", 8_000_000), ("C", int(tail_bytes)), ("D", 100))
        return list(await asyncio.gather(*(one(message_id, size) for message_id, size in sizes)))

    run(one("m0", 100))
    storage.exhaust(os.getpid())
    outcome = {"batch": run(batch())}
    storage.free()
    outcome["after_free"] = run(one("after", 100))
    print("RESULT " + json.dumps(outcome), flush=True)
    os._exit(0)  # no graceful close: the files are checked as they are


@pytest.mark.parametrize("tail_bytes", [100, 600_000], ids=["small-after", "large-after"])
def test_a_failing_job_does_not_break_its_group_commit(storage: LimitedStorage, tail_bytes: int) -> None:
    """Jobs queued together share one transaction with a SAVEPOINT each. When one of them runs
    out of space, SQLite may roll back the whole transaction by itself. The jobs before and after
    it must still be answered, and truthfully: a job answered with an error is not stored, a job
    answered OK is stored, no stored row names a parent that was rolled back, and once space is
    freed the object takes writes again. And as if each had run alone: the small jobs, which fit
    in the room left, are stored (SQLite gives up the transaction in B's statement, or, with C
    too large as well, at the COMMIT of A, C and D)."""
    storage.data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{IGNORE_SIGXFSZ}\nimport sys\nfrom tests.reliability.test_disk_full import group_commit_child as f\n"
            "f(*sys.argv[1:])",
            str(storage.data_dir),
            storage.mode,
            str(storage.mount_point or ""),
            str(tail_bytes),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    outcome = json.loads(lines[-1][len("RESULT ") :])
    answers = {a["id"]: a for a in outcome["batch"]}

    path = object_path(storage.data_dir, "group")
    report = check_object_file(path, readonly=False)
    with open_file(path) as conn:
        stored = dict(conn.execute("SELECT id, parent_id FROM cf_agents_session_messages WHERE session_id = 's'"))
    problems = []
    assert answers["B"].get("hung") or not answers["B"]["ok"], "the 8 MB write fit in a full disk?"
    # No job fails for another's sake: each is answered as if it had run alone, and the small
    # ones fit in the room left.
    fits = {"A": True, "B": False, "C": tail_bytes < SLACK_BYTES // 2, "D": True}
    if {message_id: bool(answer["ok"]) for message_id, answer in answers.items()} != fits:
        problems.append(f"expected stored: {fits}")
    for message_id, answer in answers.items():
        if answer.get("hung"):
            problems.append(f"{message_id}: no answer within {GROUP_CALL_TIMEOUT_SECONDS:.0f} s (the call hangs)")
        elif answer["ok"] and message_id not in stored:
            problems.append(f"{message_id}: answered OK but not stored")
        elif not answer["ok"] and message_id in stored:
            problems.append(f"{message_id}: answered {answer['error']!r} but stored (parent {stored[message_id]!r})")
    if not outcome["after_free"]["ok"]:
        problems.append(f"after space was freed, a small append failed: {outcome['after_free']['error']}")
    problems += report.torn
    if report.integrity != "ok":
        problems.append(f"integrity: {report.integrity}")
    assert not problems, f"[{storage.mode}] answers={answers} stored={stored}\n" + "\n".join(problems)


def test_concurrent_writers_during_disk_full_get_truthful_answers(storage: LimitedStorage) -> None:
    """Small writers keep appending while huge writes fail on a full disk. Afterwards (the server
    SIGKILLed, the file read as a restart would): every acknowledged append is stored, every
    failed one is absent, no call hangs, the file holds no torn or dangling rows, and once space
    is freed the object takes writes again."""
    key = "disk-full-busy"
    server = Server(storage.data_dir, setup=storage.setup).start()
    acknowledged: list[tuple[str, str]] = []
    failed: list[tuple[str, str, str]] = []
    unexpected: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def small_writer(worker: int) -> None:
        with SessionsClient(server.address, timeout=BUSY_CALL_TIMEOUT_SECONDS) as client:
            session = client.object(key).session(f"s{worker}")
            index = 0
            while not stop.is_set():
                message_id = f"w{worker}-{index}"
                index += 1
                try:
                    session.append_message(_text_message(message_id, 300))
                except SessionsError as exc:
                    with lock:
                        failed.append((f"s{worker}", message_id, f"{exc.code.name}/{exc.reason}"))
                        if _status(exc) not in ACCEPTED:
                            unexpected.append(f"{message_id}: {exc}")
                    if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        return  # hung: one report per writer is enough
                else:
                    with lock:
                        acknowledged.append((f"s{worker}", message_id))

    try:
        with SessionsClient(server.address, timeout=BUSY_CALL_TIMEOUT_SECONDS) as client:
            client.object(key).session("s0").append_message(_text_message("seed", 100))
            acknowledged.append(("s0", "seed"))
            storage.exhaust(server.pid)
            threads = [threading.Thread(target=small_writer, args=(w,)) for w in range(4)]
            for thread in threads:
                thread.start()
            try:
                for index in range(6):
                    try:
                        client.object(key).session("big").append_message(_text_message(f"big{index}", 8_000_000))
                        unexpected.append(f"big{index} was stored on a full disk")
                    except SessionsError as exc:
                        if _status(exc) not in ACCEPTED:
                            unexpected.append(f"big{index}: {exc}")
                        failed.append(("big", f"big{index}", f"{exc.code.name}/{exc.reason}"))
                        if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                            break
            finally:
                stop.set()
                for thread in threads:
                    thread.join(timeout=120)
            assert health_status(server.address) == SERVING
            storage.free()
            try:
                client.object(key).session("s0").append_message(_text_message("after-free", 100))
                acknowledged.append(("s0", "after-free"))
            except SessionsError as exc:
                unexpected.append(f"after space was freed, an append failed: {exc}")
        server.kill()
        path = object_path(storage.data_dir, key)
        report = check_object_file(path, readonly=False)
        with open_file(path) as conn:
            stored = set(conn.execute("SELECT session_id, id FROM cf_agents_session_messages").fetchall())
    finally:
        server.stop()
        storage.free()
    lost = [a for a in acknowledged if a not in stored]
    phantom = [f for f in failed if (f[0], f[1]) in stored]
    problems = [f"acknowledged but lost: {lost[:10]}"] if lost else []
    problems += [f"answered {f[2]} but stored: {f[:2]}" for f in phantom[:10]]
    problems += unexpected[:10] + report.torn[:10]
    if report.integrity != "ok":
        problems.append(f"integrity: {report.integrity}")
    assert not problems, f"[{storage.mode}] {len(acknowledged)} acknowledged, {len(failed)} failed\n" + "\n".join(
        problems
    )


def test_an_object_created_on_a_full_disk_is_refused_cleanly(storage: LimitedStorage) -> None:
    """Making a new object's file failed with INTERNAL: the schema's ROLLBACK after the failed
    COMMIT raised "no transaction is active" in place of the full disk, and a failure to open
    a file was not told as a storage failure at all. Once space is freed the object is made.
    The server's first new object also builds the image new files are written from
    (`schema.new_file_image`): here that build finds the disk full."""
    _create_on_a_full_disk(storage, made_before=False)


# Only on the tmpfs: the file size limit lets a new file as large as one there already be made.
@pytest.mark.parametrize("storage", ["tmpfs"], indirect=True)
def test_an_object_created_on_a_full_disk_after_another_is_refused_cleanly(storage: LimitedStorage) -> None:
    """With the image built by an earlier object, a new object's file is a write of it into
    scratch, which finds the disk full, and is removed."""
    _create_on_a_full_disk(storage, made_before=True)


def _create_on_a_full_disk(storage: LimitedStorage, *, made_before: bool) -> None:
    server = Server(storage.data_dir, setup=storage.setup).start()
    try:
        with SessionsClient(server.address, timeout=60) as client:
            if made_before:
                assert client.object("made-before").session().append_message(_text_message("m0", 100)).inserted
            session = client.object("new-on-a-full-disk").session()
            storage.exhaust(server.pid, room=4096)  # less than a new object's first pages
            with pytest.raises(SessionsError) as refused:
                session.append_message(_text_message("m1", 100))
            print(f"DISK FULL new object ({storage.mode}): {_status(refused.value)} {refused.value.message}")
            assert _status(refused.value) in ACCEPTED, refused.value
            assert health_status(server.address) == SERVING
            assert not [path.name for path in (storage.data_dir / SCRATCH_DIR_NAME).iterdir()]  # none staged
            storage.free()
            assert session.append_message(_text_message("m1", 100)).inserted
            assert session.get_history() == [json.loads(_text_message("m1", 100))]
    finally:
        storage.free()
        server.stop()


def test_a_received_object_file_that_finds_the_disk_full_is_refused_cleanly(
    storage: LimitedStorage, tmp_path: Path
) -> None:
    from sessions_client.admin import move_object

    origin = Server(tmp_path / "origin").start()
    server = Server(storage.data_dir, setup=storage.setup).start()
    try:
        with SessionsClient(origin.address) as source, SessionsClient(server.address) as destination:
            big = source.object("arriving").session()
            big.append_message(_text_message("m1", 2_000_000))  # a file of about 2 MB
            destination.object("resident").session().append_message(_text_message("r1", 100))
            storage.exhaust(server.pid)
            with pytest.raises(SessionsError) as refused:
                move_object(source, destination, "arriving")
            print(f"DISK FULL ImportObject ({storage.mode}): {_status(refused.value)} {refused.value.message}")
            assert _status(refused.value) in ACCEPTED
            if storage.mode == "tmpfs":  # refused before the file took the disk's last bytes
                assert "a copy leaves" in refused.value.message
            assert health_status(server.address) == SERVING
            assert destination.object("resident").session().get_message("r1") is not None
            assert not object_path(storage.data_dir, "arriving").exists()
            storage.free()
            assert [p.name for p in storage.data_dir.rglob("scratch/*")] == []  # the partial file is gone
            assert big.get_message("m1") is not None  # the source kept it
    finally:
        storage.free()
        server.stop()
        origin.stop()


def test_an_export_that_finds_the_disk_full_is_refused_and_leaves_the_object_writable(
    storage: LimitedStorage,
) -> None:
    server = Server(storage.data_dir, setup=storage.setup).start()
    try:
        with SessionsClient(server.address) as client:
            session = client.object("leaving").session()
            session.append_message(_text_message("m1", 2_000_000))  # its copy needs about 2 MB
            storage.exhaust(server.pid)
            if storage.mode == "rlimit":  # the copy is no larger than the file the cap was set from
                resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
            request = pb.ExportObjectRequest(object_key="leaving", lock_for_move=True)
            with pytest.raises(grpc.RpcError) as refused:
                list(client._stub.ExportObject(request, metadata=routing("leaving")))
            print(f"DISK FULL ExportObject ({storage.mode}): {refused.value.code()} {refused.value.details()}")
            assert refused.value.code() in {code for code, _ in ACCEPTED}
            if storage.mode == "tmpfs":
                # Refused before copying: a copy that took the disk's last bytes failed every
                # other object's writes until it was removed.
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "nothing was copied" in (refused.value.details() or "")
            assert [p.name for p in storage.data_dir.rglob("scratch/*")] == []  # no partial copy
            storage.free()
            # Not locked for a move that never got its copy: writes are taken at once.
            assert session.append_message(_text_message("m2", 100)).inserted
    finally:
        storage.free()
        server.stop()


def test_a_vacuum_that_finds_the_disk_full_is_refused_and_changes_nothing(storage: LimitedStorage) -> None:
    """VacuumObject needs room for a copy of the pages in use (and as much again in the WAL):
    without it, refused before anything is written, the object as it was and writable."""
    server = Server(storage.data_dir, setup=storage.setup).start()
    try:
        with SessionsClient(server.address) as client:
            obj = client.object("spacious")
            session = obj.session()
            session.append_messages([_text_message(f"m{i}", 500_000) for i in range(4)])
            session.delete_messages(["m0", "m1"])
            before = obj.get_object_stats()
            storage.exhaust(server.pid)
            if storage.mode == "rlimit":  # a copy no larger than the file the cap was set from
                resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
            with pytest.raises(SessionsError) as refused:
                obj.vacuum()
            print(f"DISK FULL VacuumObject ({storage.mode}): {refused.value.code} {refused.value.message}")
            assert refused.value.code in {code for code, _ in ACCEPTED}
            if storage.mode == "tmpfs":  # refused before writing anything
                assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "the object is as it was" in refused.value.message
            assert [p.name for p in storage.data_dir.rglob("scratch/*")] == []  # no copy left
            storage.free()
            assert [m["id"] for m in session.get_history()] == ["m2", "m3"]
            assert obj.get_object_stats().free_bytes == before.free_bytes
            assert session.append_message(_text_message("m4", 100)).inserted
    finally:
        storage.free()
        server.stop()


def test_copies_under_way_reserve_their_room(storage: LimitedStorage) -> None:
    """Two copies begun together each saw the same free space, and both ran the disk out: a
    copy under way holds its size until it is written, and the next is judged without it."""
    scratch = storage.data_dir / "scratch"
    scratch.mkdir(parents=True)
    room = ScratchRoom(scratch)
    free = free_bytes(scratch)
    if storage.mode == "tmpfs":
        storage.exhaust(room=FREE_MARGIN_BYTES + 8 * 1024 * 1024)  # room for one 6 MB copy, not two
        room.reserve(6 * 1024 * 1024, "the first copy")
        with pytest.raises(OSError) as refused:
            room.reserve(6 * 1024 * 1024, "the second copy")
        assert refused.value.errno == errno.ENOSPC
        assert "reserved by copies under way" in str(refused.value)
        room.release(6 * 1024 * 1024)  # the first is written: the disk shows it now
        room.reserve(6 * 1024 * 1024, "the second copy")
        storage.free()
    else:  # the data directory is on the machine's disk: reservations past its free space
        room.reserve(free // 2, "the first copy")
        with pytest.raises(OSError) as refused:
            room.reserve(free // 2 + 1, "the second copy")
        assert refused.value.errno == errno.ENOSPC
    assert room.reserved > 0


@pytest.mark.parametrize("storage", ["tmpfs"], indirect=True)
def test_a_received_file_of_other_pages_reserves_room_for_its_rewrite(storage: LimitedStorage, tmp_path: Path) -> None:
    """An upstream file (4 KiB pages) is rewritten to the server's pages as it is installed: an
    import audit saw a 683 MB one take the disk's last bytes beside its staged copy (the
    rewrite's journal in scratch, not counted in the room the install kept), failing another
    object's writes. The install now keeps room for the rewrite too: refused before, with the
    disk's margin left, and installed once there is room."""
    from sessions_client.admin import import_file
    from tests.storage.upstream_schema import write_upstream_store

    text = "lorem ipsum dolor sit amet " * 40
    rows = [
        (
            "",
            f"m{i}",
            i,
            f"m{i - 1}" if i else None,
            "user",
            canonical({"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": text}]}),
            i,
        )
        for i in range(600)
    ]
    upstream = tmp_path / "upstream.sqlite"
    write_upstream_store(upstream, rows, page_size=4096)
    size = upstream.stat().st_size
    server = Server(storage.data_dir, setup=storage.setup).start()
    try:
        with SessionsClient(server.address) as client:
            resident = client.object("resident").session()
            resident.append_message(_text_message("r1", 100))
            # Room for the file as it arrives and its staged copy, and half a rewrite more.
            storage.exhaust(room=FREE_MARGIN_BYTES + 2 * size + size // 2)
            with pytest.raises(SessionsError) as refused:
                import_file(client, "arriving", upstream)
            assert _status(refused.value) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "STORAGE_FULL")
            assert "installing the received file needs" in refused.value.message
            assert free_bytes(storage.data_dir) > FREE_MARGIN_BYTES
            assert resident.append_message(_text_message("r2", 100)).inserted
            assert [p.name for p in storage.data_dir.rglob("scratch/*")] == []
            assert not object_path(storage.data_dir, "arriving").exists()
            storage.free()
            assert import_file(client, "arriving", upstream).message_rows == 600
            assert [p.name for p in storage.data_dir.rglob("scratch/*")] == []
    finally:
        storage.free()
        server.stop()
