"""An import stops at a failed write: nothing after it is stored. An import's messages go to the
writer in chunks, and those that arrive while a chunk is being written wait for it; when that
write failed, they were written anyway (the next chunk was sent when the failed one finished,
or at the end of the call), leaving a gap whose later messages name parents never stored,
where the contract says a failed call keeps what committed before the failure. The domain over
real object files, no gRPC; the failure is a storage error raised inside the first chunk's
write."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import imports
from sessions_server.domain.errors import SessionsError
from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import StorageError


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]})


def test_messages_queued_behind_a_failed_write_are_not_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = imports.import_all_in
    release = threading.Event()
    calls = 0

    def first_fails(ctx: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            release.wait(timeout=30)  # until the later messages wait behind this write
            raise StorageError("disk I/O error")
        return written(ctx, *args)

    monkeypatch.setattr(imports, "import_all_in", first_fails)

    async def run() -> tuple[str, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("m0"), None, 1)  # written at once: the write that fails
                    for index in range(1, 6):
                        await importer.add(_message(f"m{index}"), f"m{index - 1}", 1)
                    release.set()
            stored = [f"m{index}" for index in range(6) if await service.get_message("o", "", f"m{index}")]
            return failure.value.reason, stored
        finally:
            await service.registry.close_all()

    reason, stored = asyncio.run(run())
    assert reason == "STORAGE_FAILURE"
    assert stored == []


def test_an_import_whose_written_messages_were_deleted_meanwhile_stops(tmp_path: Path) -> None:
    async def run() -> tuple[str, str, list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            with pytest.raises(SessionsError) as failure:
                async with service.importer("o", "") as importer:
                    await importer.add(_message("m0"), None, 1)
                    await asyncio.wait(importer._pending)  # m0 is stored
                    assert await service.delete("o", "", ["m0"]) == 1
                    await importer.add(_message("m1"), "m0", 1)
            stored = [f"m{index}" for index in range(2) if await service.get_message("o", "", f"m{index}")]
            return failure.value.reason, failure.value.message, stored
        finally:
            await service.registry.close_all()

    reason, message, stored = asyncio.run(run())
    assert reason == "FAILED_PRECONDITION"
    # It said "1 messages in" of an import none of whose messages stayed: the words say why.
    assert message == (
        "messages this import had written were deleted or cleared by another call meanwhile; it stopped there, "
        "after 1 messages (some of which that call may have removed): send the import again to write the rest "
        "(ids stored are skipped)"
    )
    assert stored == []
