"""A move's import whose caller went away while its copy was being installed kept the copy and
ended its hold: the copy took writes, while the mover, never told the hold, released its source
(its undo after SIGTERM or Ctrl-C): two copies taking writes. The copy stays held now. The domain
over real object files, no gRPC; the install is paused (then run as it is) to cancel inside it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.errors import StorageFailure, Unavailable
from sessions_server.domain.service import SessionsService
from sessions_server.storage import files
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


async def _sent(exported: list[Any]) -> AsyncIterator[tuple[bytes, str]]:
    """An export's frames as `receive` takes them."""
    for frame in exported:
        yield frame.data, frame.sha256


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": "hello"}]})


def test_an_import_cancelled_while_installed_keeps_its_copy_held(tmp_path: Path) -> None:
    async def run() -> tuple[bool, str]:
        registry = ObjectRegistry(tmp_path / "data", ThreadPoolExecutor(max_workers=4))
        service = SessionsService(registry)
        objects = service.objects
        installing, go = threading.Event(), threading.Event()
        real_install = objects._install

        def paused_install(*args: Any) -> int:
            installing.set()
            go.wait(30)
            return real_install(*args)

        objects._install = paused_install  # type: ignore[method-assign]
        try:
            await service.append("source", "", _message("m1"), Parent.auto(), from_client=True)
            exported = [frame async for frame in objects.export("source", lock_for_move=False, lease_seconds=0)]

            receiving = asyncio.create_task(
                objects.receive("arriving", _sent(exported), replace=False, hold_for_move=True)
            )
            await asyncio.to_thread(installing.wait, 30)
            receiving.cancel()
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await receiving
            with pytest.raises(Unavailable) as held:
                objects.admit("arriving", writing=True)
            return object_path(registry.data_dir, "arriving").exists(), held.value.reason
        finally:
            go.set()
            await registry.close_all()

    assert asyncio.run(run()) == (True, "OBJECT_MOVING")


def test_an_import_that_failed_before_replacing_a_leftover_holds_nothing(tmp_path: Path) -> None:
    """A key moved away whose delete was cut short keeps its file; a move back whose install
    fails before replacing it (the disk, here) must not hold that leftover: the key is refused as
    moved, so neither an erase naming the hold nor AbortMove could release it (a review)."""

    async def run() -> tuple[bool, bool]:
        registry = ObjectRegistry(tmp_path / "data", ThreadPoolExecutor(max_workers=4))
        service = SessionsService(registry)
        objects = service.objects
        try:
            await service.append("k", "", _message("m1"), Parent.auto(), from_client=True)
            exported = [frame async for frame in objects.export("k", lock_for_move=False, lease_seconds=0)]
            await registry.close_all()
            objects._moved.record("k", "elsewhere:1")  # moved away, its file left by a delete cut short

            def full_disk(*args: Any) -> int:
                raise OSError(28, "No space left on device")

            objects._install = full_disk  # type: ignore[method-assign]

            with pytest.raises(Exception, match="No space left"):
                await objects.receive("k", _sent(exported), replace=False, hold_for_move=True)
            lock = objects._moving.get("k")
            return object_path(registry.data_dir, "k").exists(), lock is not None
        finally:
            await registry.close_all()

    assert asyncio.run(run()) == (True, False)


@pytest.mark.parametrize("failing", ["the disk", "the row count"])
def test_a_storage_failure_after_the_held_install_names_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A failure after the copy was installed (the directory's sync, the row count) left it held
    and answered STORAGE_FAILURE without the hold's id: the mover could not drop the copy, and
    nobody else knew how (a review). The answer names the hold now, in its metadata (`move_id`)
    and its message, and an erase naming it drops the copy."""

    async def run() -> tuple[str, bool, bool, bool]:
        registry = ObjectRegistry(tmp_path / "data", ThreadPoolExecutor(max_workers=4))
        service = SessionsService(registry)
        objects = service.objects
        real_install, real_open = objects._install, files.open_read_only

        def install_then_fail(*args: Any) -> int:
            real_install(*args)
            raise OSError(5, "Input/output error")

        def failing_at_the_installed_file(path: Path, *args: Any, **kwargs: Any) -> Any:
            if path == object_path(registry.data_dir, "arriving"):  # the count after the install
                raise sqlite3.OperationalError("disk I/O error")
            return real_open(path, *args, **kwargs)

        try:
            await service.append("source", "", _message("m1"), Parent.auto(), from_client=True)
            exported = [frame async for frame in objects.export("source", lock_for_move=False, lease_seconds=0)]

            if failing == "the disk":
                objects._install = install_then_fail  # type: ignore[method-assign]
            else:
                monkeypatch.setattr(files, "open_read_only", failing_at_the_installed_file)
            with pytest.raises(StorageFailure) as failed:
                await objects.receive("arriving", _sent(exported), replace=False, hold_for_move=True)
            lock = objects._moving["arriving"]
            hold = failed.value.metadata.get("move_id", "")
            named = hold == lock.id and f"move_id {lock.id}" in failed.value.message
            says_why = ("Input/output error" if failing == "the disk" else "disk I/O error") in failed.value.message
            monkeypatch.undo()
            dropped = await objects.erase("arriving", move_id=hold)
            gone = not object_path(registry.data_dir, "arriving").exists()
            return failed.value.reason, says_why, named, dropped and gone
        finally:
            await registry.close_all()

    assert asyncio.run(run()) == ("STORAGE_FAILURE", True, True, True)
