"""Issue 13 end to end: a shard replicated by Litestream (deploy/litestream/litestream.yml) to a local
S3 server (moto) under write load loses its machine (server and Litestream killed, data directory
deleted); deploy/litestream/restore.sh rebuilds it in a fresh directory; a fresh server serves it.
Every write confirmed in the replica before the loss, and every write acknowledged longer than the
RPO bound before it, comes back byte-exact; nothing comes back out of order or with holes; every
restored file passes PRAGMA integrity_check; one object restores to a point in time.

Needs `litestream` v0.5.18 (.tools/bin, see docs/operations.md) and `moto[server]` (dev deps)."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import threading
import time
from pathlib import Path

import pytest

from sessions_client import SessionsClient, SessionsError
from sessions_server.storage.paths import object_path
from sessions_server.storage.schema import BUSY_TIMEOUT_MS
from tests.deploy.litestream_support import (
    Replicator,
    S3Server,
    integrity,
    message_rows,
    restore,
)
from tests.deploy.support import Shard, free_port, text_message

pytestmark = pytest.mark.long  # about 90 s: started first (see tests/conftest.py)

OBJECTS = 40
# Acknowledged writes older than this before the loss must be in the restored shard. Litestream
# syncs every monitor-interval (1 s) and uploads every sync-interval (1 s): the bound is their sum
# with room for a slow CI machine.
RPO_BOUND_SECONDS = 6.0


def _ids(path: Path) -> list[str]:
    return [row[1] for row in message_rows(path)]


def _wait_replicated(
    replica: Replicator, s3: S3Server, scratch: Path, expected: dict[str, list[str]], *, timeout: float
) -> None:
    """Polls (restoring into `scratch`) until the replica holds, for every key, at least the
    expected message ids, in order."""
    pending = dict(expected)
    deadline = time.monotonic() + timeout
    while pending:
        shutil.rmtree(scratch, ignore_errors=True)
        restore(replica.replica, s3, scratch, keys=pending, skip_missing=True)
        for key in list(pending):
            path = object_path(scratch, key)
            if path.exists() and _ids(path)[: len(pending[key])] == pending[key]:
                del pending[key]
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"not replicated within {timeout}s: {sorted(pending)[:5]}")


def _utc(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _replicated_shard(
    stack: contextlib.ExitStack, tmp_path: Path, *shard_args: str
) -> tuple[S3Server, Shard, Replicator]:
    """An S3 server, a shard and Litestream replicating it, each stopped by `stack` once started:
    whichever fails to start (Litestream missing, say), those started before it stop."""
    s3 = S3Server(tmp_path / "s3")
    stack.callback(s3.stop)
    s3.start()
    data = tmp_path / "shard" / "data"
    data.mkdir(parents=True)
    shard = Shard("shard", data, free_port(), *shard_args)
    stack.callback(shard.stop)
    shard.start()
    replicator = Replicator(data, s3, "shard-0", tmp_path / "litestream.log")
    stack.callback(replicator.kill)
    replicator.start()
    return s3, shard, replicator


@pytest.fixture
def replicated_shard(tmp_path: Path):  # type: ignore[no-untyped-def]
    with contextlib.ExitStack() as stack:
        # --max-open-objects above the object count: see docs/operations.md ("Replication") for
        # why closing an object stalls while Litestream holds its read lock, until the server change.
        yield _replicated_shard(stack, tmp_path, "--max-open-objects", "1000")


def test_lose_the_shard_restore_everything_and_a_point_in_time(replicated_shard, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s3, shard, replicator = replicated_shard
    keys = [f"user-{i}/conversation" for i in range(OBJECTS)]
    acknowledged: dict[str, list[tuple[str, float]]] = {key: [] for key in keys}

    # Phase 1: every object gets messages of varied sizes (one spans continuation rows).
    with SessionsClient(shard.address) as client:
        for index, key in enumerate(keys):
            session = client.object(key).session()
            for n in range(3):
                size = 2_000_000 if (index, n) == (0, 1) else 200 * (n + 1) + index
                session.append_message(text_message(f"p{n}", f"{key} {n} " + "é" * size))
                acknowledged[key].append((f"p{n}", time.time()))
        # The point-in-time object: state A, replicated, then the clock moves on, then state B.
        pitr = client.object("pitr/one").session()
        for n in range(3):
            pitr.append_message(text_message(f"a{n}", f"state A {n}"))
        # Written before the moment only: Litestream refuses a time after an object's newest file
        # as it refuses one before its first, and such an object was skipped as "created after".
        client.object("pitr/idle").session().append_message(text_message("i0", "unchanged since"))
    _wait_replicated(
        replicator, s3, tmp_path / "poll", {"pitr/one": ["a0", "a1", "a2"], "pitr/idle": ["i0"]}, timeout=60
    )
    moment = time.time()
    state_a = message_rows(object_path(shard.data_dir, "pitr/one"))
    idle = message_rows(object_path(shard.data_dir, "pitr/idle"))
    while time.time() < moment + 1.5:  # B's transactions must be stamped after `moment`
        time.sleep(0.05)
    with SessionsClient(shard.address) as client:
        pitr = client.object("pitr/one").session()
        pitr.append_message(text_message("b0", "state B"))
        pitr.delete_messages(["a1"])
        client.object("pitr/later").session().append_message(text_message("l0", "created after the moment"))

    # Phase 2: wait until the replica holds every phase-1 write.
    phase1 = {key: [m for m, _ in acknowledged[key]] for key in keys} | {"pitr/later": ["l0"]}
    _wait_replicated(replicator, s3, tmp_path / "poll", phase1, timeout=90)
    confirmed = {key: message_rows(object_path(shard.data_dir, key)) for key in keys}

    # Phase 3: steady writes to every object while the machine is lost.
    stop = threading.Event()
    in_flight: dict[str, str] = {}  # the call cut off by the loss may have committed

    def write() -> None:
        with SessionsClient(shard.address) as client:
            n = 0
            while not stop.is_set():
                key = keys[n % len(keys)]
                message_id = f"w{n}"
                in_flight.clear()
                in_flight[key] = message_id
                try:
                    client.object(key).session().append_message(text_message(message_id, f"{key} live {n}"))
                except SessionsError:  # the shard is gone: this write was never acknowledged
                    return
                acknowledged[key].append((message_id, time.time()))
                n += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    started = time.time()
    while time.time() < started + RPO_BOUND_SECONDS + 3 and writer.is_alive():
        time.sleep(0.1)
    lost_at = time.time()
    replicator.kill()
    shard.stop()  # SIGTERM after Litestream is gone: the writer's calls fail from here on
    stop.set()
    writer.join(timeout=30)
    shutil.rmtree(shard.data_dir)

    # Restore everything into a fresh directory and serve it.
    fresh = tmp_path / "restored" / "data"
    result = restore(replicator.replica, s3, fresh, check="quick")
    restored_files = sorted((fresh / "objects").glob("*/*/*.sqlite"))
    assert len(restored_files) == OBJECTS + 3, result.stderr
    for path in restored_files:
        assert integrity(path) == "ok", path
    for key in keys:
        rows = message_rows(object_path(fresh, key))
        assert rows[: len(confirmed[key])] == confirmed[key], f"{key}: replicated rows differ (byte-exact)"
        ids = [row[1] for row in rows]
        order = [m for m, _ in acknowledged[key]] + ([in_flight[key]] if key in in_flight else [])
        assert ids == order[: len(ids)], f"{key}: restored history is not a prefix of the acknowledged one"
        old_enough = [m for m, at in acknowledged[key] if at < lost_at - RPO_BOUND_SECONDS]
        assert ids[: len(old_enough)] == old_enough, f"{key}: lost a write older than {RPO_BOUND_SECONDS}s"
    server = Shard("restored", fresh, free_port()).start()
    try:
        with SessionsClient(server.address) as client:
            for key in keys[:10]:
                history = client.object(key).session().get_history()
                assert [m["id"] for m in history] == [row[1] for row in message_rows(object_path(fresh, key))]
            assert history[0] == text_message("p0", f"{keys[9]} 0 " + "é" * (200 + 9))
            client.object(keys[0]).session().append_message(text_message("after", "the restore"))
    finally:
        server.stop()

    # Point in time: the object as it was at `moment` (state A), not as it is now (state B).
    at_moment = tmp_path / "pitr" / "data"
    restore(replicator.replica, s3, at_moment, keys=["pitr/one"], timestamp=_utc(moment))
    assert message_rows(object_path(at_moment, "pitr/one")) == state_a
    idle_at_moment = tmp_path / "pitr-idle" / "data"
    restore(replicator.replica, s3, idle_at_moment, keys=["pitr/idle"], timestamp=_utc(moment))
    assert message_rows(object_path(idle_at_moment, "pitr/idle")) == idle
    latest = message_rows(object_path(fresh, "pitr/one"))
    assert [row[1] for row in latest] == ["a0", "a2", "b0"]
    assert integrity(object_path(at_moment, "pitr/one")) == "ok"

    # The whole shard at that moment: an object created after it is skipped, not a failure
    # (Litestream 0.5 says "timestamp does not exist" for it).
    shard_at_moment = tmp_path / "pitr-shard" / "data"
    result = restore(replicator.replica, s3, shard_at_moment, timestamp=_utc(moment))
    assert message_rows(object_path(shard_at_moment, "pitr/one")) == state_a
    assert message_rows(object_path(shard_at_moment, "pitr/idle")) == idle
    assert not object_path(shard_at_moment, "pitr/later").exists()
    assert "skipped" in result.stderr
    for key in keys:
        assert message_rows(object_path(shard_at_moment, key))[:3] == confirmed[key][:3]


def test_shutdown_does_not_stall_while_litestream_replicates(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        s3, shard, replicator = _replicated_shard(stack, tmp_path)
        with SessionsClient(shard.address) as client:
            session = client.object("o").session()
            session.append_message(text_message("m1", "x"))
            # Litestream takes the object (and its long-running read transaction).
            _wait_replicated(replicator, s3, tmp_path / "poll", {"o": ["m1"]}, timeout=60)
            session.append_message(text_message("m2", "y"))  # Litestream's snapshot is now behind
        started = time.monotonic()
        shard.stop()  # SIGTERM: drain, then close every open object
        took = time.monotonic() - started
        # A close that waited on Litestream's read would take the whole busy timeout; a
        # shutdown well short of it did not wait.
        stall = BUSY_TIMEOUT_MS / 1000
        assert took < stall * 0.8, f"shutdown took {took:.1f}s with one replicated object open ({stall:.0f}s stall)"


def test_a_vacuumed_object_restores_as_the_server_holds_it(tmp_path: Path) -> None:
    """VacuumObject writes the object's pages back through SQLite (one commit, the file shrunk
    by the checkpoint after it), so Litestream replicates it as any commit: the replica restores
    the object's rows after the rewrite and after writes that follow it."""
    with contextlib.ExitStack() as stack:
        s3, shard, replicator = _replicated_shard(stack, tmp_path)
        with SessionsClient(shard.address) as client:
            obj = client.object("vacuumed")
            session = obj.session()
            session.append_messages([text_message(f"m{i}", f"{i} " + "x" * 200_000) for i in range(20)])
            _wait_replicated(replicator, s3, tmp_path / "poll", {"vacuumed": [f"m{i}" for i in range(20)]}, timeout=60)
            session.delete_messages([f"m{i}" for i in range(17)])
            obj.vacuum()  # the file shrinks only once Litestream lets the WAL be checkpointed
            assert obj.get_object_stats().free_bytes == 0
            session.append_message(text_message("after", "written after the vacuum"))
        expected = ["m17", "m18", "m19", "after"]
        _wait_replicated(replicator, s3, tmp_path / "poll", {"vacuumed": expected}, timeout=60)
        held = message_rows(object_path(shard.data_dir, "vacuumed"))
        restored = tmp_path / "restored" / "data"
        restore(replicator.replica, s3, restored, keys=["vacuumed"])
        path = object_path(restored, "vacuumed")
        assert integrity(path) == "ok"
        assert _ids(path) == expected
        assert message_rows(path) == held
