"""The data directory: one owner at a time (its lock), and directories created durably."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.storage import datadir
from sessions_server.storage.datadir import DataDirectoryInUse, DataDirectoryLock
from sessions_server.storage.paths import object_file_name, object_path
from sessions_server.storage.store import ObjectStore


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """The directories (and files) our code syncs, in order; fsync still happens (the spy only
    records). SQLite's own syncs do not pass through Python."""
    seen: list[Path] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(datadir.os, "fsync", recording_fsync)
    yield seen


@pytest.mark.parametrize("staged", [False, True], ids=["made-by-sqlite", "staged"])
def test_a_new_objects_directories_are_synced_in_the_directories_that_hold_their_names(
    tmp_path: Path, synced: list[Path], staged: bool
) -> None:
    # A power cut cannot be simulated here; what can be checked is that each directory the
    # open created has its name made durable by a sync of its parent, before the first write.
    # A staged file (`files.stage_new_object_file`) is synced itself first, in scratch.
    data_dir = tmp_path / "data"
    staging = data_dir / "scratch" if staged else None
    (data_dir / "objects").mkdir(parents=True)
    first = object_path(data_dir, "first")
    leaf = first.parent
    prefix = object_file_name("first")[:4]  # the two directory levels
    sibling = next(key for key in (f"k{n}" for n in range(10_000_000)) if object_file_name(key)[:4] == prefix)

    async def open_and_close(key: str) -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        try:
            store = ObjectStore.open(key, object_path(data_dir, key), executor, staging=staging)
            await store.close()
        finally:
            executor.shutdown(wait=True)

    def staged_files() -> list[Path]:
        return [path for path in synced if path.parent == staging and path.suffix == ".new"]

    asyncio.run(open_and_close("first"))
    assert len(staged_files()) == staged
    # objects/ab/cd: cd named in ab, ab in objects
    assert synced[len(staged_files()) :] == [leaf.parent, data_dir / "objects"]
    assert first.is_file()

    synced.clear()  # another object in the same directories creates none: no sync
    asyncio.run(open_and_close(sibling))
    assert len(staged_files()) == staged
    assert synced == staged_files()


def test_make_directories_syncs_each_created_directorys_parent_deepest_first(
    tmp_path: Path, synced: list[Path]
) -> None:
    datadir.make_directories(tmp_path / "a" / "b" / "c")
    assert synced == [tmp_path / "a" / "b", tmp_path / "a", tmp_path]
    synced.clear()
    datadir.make_directories(tmp_path / "a" / "b")
    assert synced == []
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(FileExistsError):
        datadir.make_directories(tmp_path / "file")


def test_a_second_taker_is_refused_naming_the_holder_until_it_releases(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = DataDirectoryLock.acquire(data_dir, "the first server")
    assert first.held
    with pytest.raises(DataDirectoryInUse) as refused:
        DataDirectoryLock.acquire(data_dir, "the second server")
    assert str(refused.value) == f"data directory {data_dir} is in use by pid {os.getpid()} (the first server)"
    assert isinstance(refused.value, OSError)  # the CLI reports OSErrors as a line and exit 1

    first.release()
    first.release()  # twice is harmless
    assert not first.held
    second = DataDirectoryLock.acquire(data_dir, "the second server")
    try:
        assert (data_dir / datadir.LOCK_FILE_NAME).read_text() == f"pid {os.getpid()} (the second server)\n"
    finally:
        second.release()


def test_the_lock_of_a_process_that_died_is_free_at_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path;"
            "from sessions_server.storage.datadir import DataDirectoryLock;"
            f"DataDirectoryLock.acquire(Path({str(data_dir)!r}), 'a process that will be killed');"
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(DataDirectoryInUse, match=rf"in use by pid {holder.pid} \(a process that will be killed\)"):
            DataDirectoryLock.acquire(data_dir, "this test")
        holder.send_signal(signal.SIGKILL)  # no release: the kernel drops the lock with the process
        holder.wait(timeout=30)
        DataDirectoryLock.acquire(data_dir, "this test").release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_clearing_scratch_removes_its_files_and_counts_them(tmp_path: Path) -> None:
    assert datadir.clear_scratch(tmp_path) == (0, 0)  # no scratch directory yet
    scratch = tmp_path / datadir.SCRATCH_DIR_NAME
    scratch.mkdir()
    (scratch / "export-1.sqlite").write_bytes(b"x" * 1000)
    (scratch / "import-2").write_bytes(b"y" * 24)
    assert datadir.clear_scratch(tmp_path) == (2, 1024)
    assert list(scratch.iterdir()) == []


def test_abandoning_removes_only_what_its_holder_made_not_a_neighbours_data_directory(tmp_path: Path) -> None:
    """Two data directories made at once under a parent neither found: the one whose start
    failed removes its own directories and lock file, and leaves the other's, its lock and its
    objects (it took the parent it had made down with all of that)."""
    fleet = tmp_path / "fleet"
    failed = DataDirectoryLock.acquire(fleet / "shard-a", "a start that fails")
    running = DataDirectoryLock.acquire(fleet / "shard-b", "a running server")
    precious = fleet / "shard-b" / "objects" / "precious.sqlite"
    precious.parent.mkdir()
    precious.write_bytes(b"the other server's object")
    made = fleet / "shard-a" / "objects" / "ab" / "cd"
    made.mkdir(parents=True)  # left empty by the failed work
    failed.note_created([fleet / "shard-a" / "objects"])
    try:
        failed.abandon()
        assert not (fleet / "shard-a").exists()
        assert precious.read_bytes() == b"the other server's object"
        assert (fleet / "shard-b" / datadir.LOCK_FILE_NAME).exists()
        with pytest.raises(DataDirectoryInUse):  # its lock still holds
            DataDirectoryLock.acquire(fleet / "shard-b", "a third taker")
    finally:
        running.release()
