"""Many objects: touch 20,000 object keys with --max-open-objects 64; file descriptors stay bounded.

One append to each of MANY_OBJECTS (default 20,000) distinct keys from several client threads,
while a sampler reads the server's open descriptors (`/proc/<pid>/fd`) every 20 ms. The server
runs with its descriptor limit lowered to 1,024 (RLIMIT_NOFILE), so a leak shows up as EMFILE
errors rather than passing unnoticed under a large host limit.

Bound: an open object holds one writer connection (database + WAL descriptors), the shared-memory
file, and up to MAX_IDLE_READERS idle reader connections (database + WAL each):
64 x (3 + 2 x 4) = 704, plus 64 for gRPC, logging and the interpreter. Objects closed by eviction
release theirs, so the count must stay below that however many keys are touched. Afterwards every
object reads back (a sample of 500 keys through GetMessage, which reopens evicted objects, and
ListObjects over all of them, which opens every file and reads the key recorded in it).

The data directory is on /dev/shm when it is a tmpfs with room for all of them (the test is
about descriptors, not fsync latency, and 20,000 fsync-ed file creations on a slow disk take
minutes). Otherwise it is on the test's tmp_path with ON_DISK_OBJECTS keys: an object file is
208 KiB (13 b-trees of 16 KiB pages), so 20,000 would fill 4.3 GB of a disk the rest of the
suite needs, and 2,500 still touch more than twice as many objects as the server may hold
descriptors, so a descriptor kept per object runs out all the same. The files are removed
however the test ends. MANY_OBJECTS can be lowered for quick runs.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sessions_proto.v1 import sessions_pb2 as pb
from sessions_proto.v1 import sessions_pb2_grpc as pb_grpc
from sessions_server.storage.store import MAX_IDLE_READERS
from tests.reliability.support import Server, canonical, object_files, routing, stored_json

pytestmark = pytest.mark.long  # about 190 s: started first (see tests/conftest.py)

MANY_OBJECTS = int(os.environ.get("MANY_OBJECTS", "20000"))
ON_DISK_OBJECTS = min(MANY_OBJECTS, 2_500)
ROOM_PER_OBJECT = 256 * 1024  # an object file (208 KiB) and its share of directories and WAL
MAX_OPEN = 64
NOFILE = 1024
FD_BOUND = MAX_OPEN * (3 + 2 * MAX_IDLE_READERS) + 64
THREADS = 12
WINDOW = 4  # calls in flight per thread


# The server gets a 1,024-descriptor limit, whatever the host allows.
LIMIT_DESCRIPTORS = f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE}))"


@dataclass(frozen=True)
class Place:
    data_dir: Path
    keys: int


def _free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and _free_bytes(shm) > MANY_OBJECTS * ROOM_PER_OBJECT:
        chosen = Place(shm / f"sessions-many-{uuid.uuid4().hex}", MANY_OBJECTS)
    else:
        chosen = Place(tmp_path / "data", ON_DISK_OBJECTS)
        needed = chosen.keys * ROOM_PER_OBJECT
        if _free_bytes(tmp_path) < needed + 512 * 2**20:
            pytest.fail(
                f"{chosen.keys} objects need {needed // 2**20} MiB on {tmp_path}, and 512 MiB to spare, "
                f"{_free_bytes(tmp_path) // 2**20} MiB is; set MANY_OBJECTS lower or free some disk",
                pytrace=False,
            )
    chosen.data_dir.mkdir()
    try:
        yield chosen
    finally:
        shutil.rmtree(chosen.data_dir, ignore_errors=True)


def _key(index: int) -> str:
    return f"many-{index:05d}"


def _text(index: int) -> str:
    return canonical({"id": "m", "role": "user", "parts": [{"type": "text", "text": f"object {index}"}]})


@pytest.mark.timeout(600)
def test_twenty_thousand_objects_keep_descriptors_bounded(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir, keys = place.data_dir, place.keys
    server = Server(data_dir, "--max-open-objects", str(MAX_OPEN), setup=LIMIT_DESCRIPTORS).start()
    pid = server.pid
    samples: list[int] = []
    stop = threading.Event()
    errors: list[str] = []
    done = Counter[str]()
    lock = threading.Lock()

    def sampler() -> None:
        while not stop.is_set():
            try:
                samples.append(len(os.listdir(f"/proc/{pid}/fd")))
            except FileNotFoundError:
                return
            stop.wait(0.02)  # sampling interval

    def writer(worker: int) -> None:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            pending: list[tuple[int, grpc.Future]] = []

            def settle(index: int, future: grpc.Future) -> None:
                try:
                    response = future.result(timeout=120)
                    ok = response.inserted
                    outcome = "inserted" if ok else "not inserted"
                except grpc.RpcError as error:
                    outcome = error.code().name
                    with lock:
                        errors.append(f"{_key(index)}: {error.code().name} {error.details()}")
                with lock:
                    done[outcome] += 1

            for index in range(worker, keys, THREADS):
                key = _key(index)
                request = pb.AppendMessageRequest(object_key=key, message_json=_text(index))
                pending.append((index, stub.AppendMessage.future(request, metadata=routing(key), timeout=120)))
                if len(pending) >= WINDOW:
                    settle(*pending.pop(0))
            for item in pending:
                settle(*item)

    started = time.monotonic()
    sampling = threading.Thread(target=sampler, name="fd-sampler")
    sampling.start()
    threads = [threading.Thread(target=writer, args=(w,), name=f"many-writer-{w}") for w in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        elapsed = time.monotonic() - started

        # Every object reads back: a random sample by GetMessage, all of them by ListObjects.
        sample = random.Random(7).sample(range(keys), min(500, keys))
        unreadable = []
        listed: set[str] = set()
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            for index in sample:
                if stored_json(stub, _key(index), "", "m") != _text(index):
                    unreadable.append(_key(index))
            token = ""
            while True:
                page = stub.ListObjects(pb.ListObjectsRequest(page_size=1000, page_token=token), timeout=60)
                listed.update(page.object_keys)
                token = page.next_page_token
                if not token:
                    break
    finally:
        stop.set()
        sampling.join(timeout=10)
        exit_code = server.signal(signal.SIGTERM, timeout=120)
    emfile = [line for line in server.output().splitlines() if "Too many open files" in line or "EMFILE" in line]
    files = len(object_files(data_dir))
    peak = max(samples) if samples else -1
    summary = (
        f"MANY OBJECTS SUMMARY keys={keys} in {elapsed:.1f}s ({keys / elapsed:.0f}/s) "
        f"max-open-objects={MAX_OPEN} fd peak={peak} bound={FD_BOUND} samples={len(samples)} "
        f"outcomes={dict(done)} errors={len(errors)} EMFILE log lines={len(emfile)} files={files} "
        f"listed={len(listed)} unreadable={len(unreadable)}/{len(sample)} exit={exit_code} data={data_dir}"
    )
    with capsys.disabled():
        print("\n" + summary)
    assert not errors, f"{len(errors)} errors, e.g.:\n" + "\n".join(errors[:10])
    assert done["inserted"] == keys, summary
    assert samples and peak <= FD_BOUND, summary
    assert not emfile, "\n".join(emfile[:10])
    assert files == keys, summary
    assert listed == {_key(i) for i in range(keys)}, summary
    assert not unreadable, f"{len(unreadable)} objects do not read back, e.g. {unreadable[:5]}"
    assert exit_code == 0, summary
