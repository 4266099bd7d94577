"""A move's delete that fails to record the move deletes nothing and leaves the move lock as it
was: its lease runs on, so the object takes writes again when it ends (or at AbortMove). The
delete held the lock for good while it worked and kept it so on failure: the object refused
every write until someone called AbortMove. The domain over real object files; the moved
journal's write fails as a full disk would."""

from __future__ import annotations

import asyncio
import errno
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain.errors import SessionsError
from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


async def _locked_for_a_move(service: SessionsService) -> str:
    """Object "o" with message m1, exported with a move's lock: the lock's id."""
    text = json.dumps({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]})
    await service.append("o", "", text, Parent.auto(), from_client=True)
    move_id = ""
    async for frame in service.objects.export("o", lock_for_move=True, lease_seconds=60):
        move_id = frame.move_id or move_id
    return move_id


def test_a_delete_that_cannot_record_the_move_keeps_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[str, float, float, bool]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await _locked_for_a_move(service)
            leased = service.objects._moving["o"].expiry

            def full_disk(*args: object) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(service.objects._moved, "record", full_disk)
            with pytest.raises(SessionsError) as failure:
                await service.objects.delete("o", moved_to="elsewhere:1")
            kept = await service.get_message("o", "", "m1") is not None
            return failure.value.reason, leased, service.objects._moving["o"].expiry, kept
        finally:
            await service.registry.close_all()

    reason, leased, after, kept = asyncio.run(run())
    assert reason == "STORAGE_FULL"
    assert after == leased != math.inf
    assert after > time.monotonic()  # still the move's: writes wait for its end or AbortMove
    assert kept


def test_a_delete_asked_again_while_the_first_records_the_move_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repeat of a move's delete removes what files a delete cut short left. One asked while
    the first was still writing its record took the refusal in memory for the record and removed
    the files: when the record then failed, the object was gone and its key not moved. It now
    waits for the first to end, then tries (and here fails) on its own."""

    async def run() -> tuple[bool, list[str], bool]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await _locked_for_a_move(service)
            recording, fail = threading.Event(), threading.Event()

            def full_disk(*args: object) -> None:
                recording.set()
                assert fail.wait(30)
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(service.objects._moved, "record", full_disk)
            first = asyncio.ensure_future(service.objects.delete("o", moved_to="elsewhere:1"))
            assert await asyncio.to_thread(recording.wait, 30)
            again = asyncio.ensure_future(service.objects.delete("o", moved_to="elsewhere:1"))
            await asyncio.wait([again], timeout=0)  # it runs as far as it goes without waiting
            waited = not again.done()
            fail.set()
            reasons = []
            for delete in (first, again):
                with pytest.raises(SessionsError) as failed:
                    await delete
                reasons.append(failed.value.reason)
            return waited, reasons, await service.get_message("o", "", "m1") is not None
        finally:
            await service.registry.close_all()

    waited, reasons, kept = asyncio.run(run())
    assert waited
    assert reasons == ["STORAGE_FULL", "STORAGE_FULL"]
    assert kept


def test_an_export_whose_move_lock_is_released_before_its_last_frame_is_cut_short(tmp_path: Path) -> None:
    """A mover stalled mid-export while an operator released its lock and moved the object again
    got the whole copy, its last frame naming the lock: resumed, it installed the stale copy at
    the destination (with replace, over the object the other move had brought there, then
    dropped it when its delete was refused: every write since was lost)."""

    async def run() -> tuple[int, str, bool]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            big = json.dumps({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "x" * 7_000_000}]})
            await service.append("o", "", big, Parent.auto(), from_client=True)
            frames = service.objects.export("o", lock_for_move=True, lease_seconds=60)
            first = await anext(frames)  # the mover stalls here
            assert (await service.objects.abort_move("o")).held
            with pytest.raises(SessionsError) as cut:
                async for _ in frames:
                    pass
            takes_writes = await service.append(
                "o", "", json.dumps({"id": "m2", "role": "user", "parts": []}), Parent.auto(), from_client=True
            )
            return len(first.data), cut.value.reason, takes_writes.inserted
        finally:
            await service.registry.close_all()

    sent, reason, takes_writes = asyncio.run(run())
    assert sent > 0
    assert reason == "FAILED_PRECONDITION"
    assert takes_writes


def test_a_delete_done_but_whose_lock_could_not_be_taken_off_the_disk_is_answered_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded and its files gone, the delete failed to take its lock off DEPARTING and was
    answered as a storage failure: the mover, told nothing was deleted, dropped the
    destination's copy, the only one left. A restart drops a lock whose key is recorded as moved."""

    async def run() -> tuple[bool, str | None]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            move_id = await _locked_for_a_move(service)

            def failing_disk(*args: object) -> None:
                raise OSError(errno.EIO, "Input/output error")

            monkeypatch.setattr(service.objects._departures, "end", failing_disk)
            deleted = await service.objects.delete("o", moved_to="elsewhere:1", move_id=move_id)
            return deleted, service.objects._moved.where("o")
        finally:
            await service.registry.close_all()

    deleted, where = asyncio.run(run())
    assert deleted and where == "elsewhere:1"
