"""What an append does after its commit does not become its answer. With automatic compaction on,
an append reads the session's policy and token estimate to decide whether to start one; those
reads ran inside the append's use of the object, whose errors mean "nothing was written", so a
failed read (no descriptor for a reader, a storage error) answered SERVER_BUSY or
STORAGE_FAILURE for a message that was stored. The domain over real object files, no gRPC."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.compactor import Compactor, Policy
from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import OutOfDescriptors, Parent, StorageError


class _Summarizer:
    async def summarize(self, prompt: str) -> str:
        return "summary"


@pytest.mark.parametrize("failure", [StorageError("disk I/O error"), OutOfDescriptors("no descriptor")])
def test_an_append_whose_compaction_check_fails_is_answered_as_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: Exception
) -> None:
    async def failing_estimate(self: Compactor, *args: Any) -> int:
        raise failure

    async def run() -> tuple[bool, bool]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)), summarizer=_Summarizer())
        try:
            await service.compactor.set_policy("o", "", Policy(threshold_tokens=1))
            monkeypatch.setattr(Compactor, "token_estimate", failing_estimate)
            text = json.dumps({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello"}]})
            result = await service.append("o", "", text, Parent.auto(), from_client=True)
            return result.inserted, await service.get_message("o", "", "m1") is not None
        finally:
            await service.registry.close_all()

    with caplog.at_level(logging.WARNING, logger="sessions.compaction"):
        assert asyncio.run(run()) == (True, True)
    assert "could not check for automatic compaction" in caplog.text
