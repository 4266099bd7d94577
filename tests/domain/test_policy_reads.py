"""The session's compaction policy, which a server with a summarizer checks after the first
append to a session of an open object, is two point reads: for a lone caller they run in place
(on the event loop's thread), not on a worker thread, as a cold object's first append would
otherwise pay a thread hop for them. The domain over a real object file."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain import compactor as compactor_module
from sessions_server.domain.compactor import Policy
from sessions_server.domain.service import AppendInput, SessionsService
from sessions_server.storage import store as store_module
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


class _Summarizer:
    async def summarize(self, prompt: str) -> str:
        raise AssertionError("the threshold is never crossed here")


def _message(message_id: str) -> str:
    return json.dumps({"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]})


@pytest.mark.parametrize(("calls", "in_place"), [(lambda: 1, True), (lambda: 2, False)], ids=["lone", "busy"])
def test_the_policy_is_read_in_place_for_a_lone_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: Callable[[], int], in_place: bool
) -> None:
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)  # however slowly this machine reads
    test_thread = threading.get_ident()
    read_on: list[bool] = []
    get_config = compactor_module.queries.get_config

    def recorded(*args: Any) -> Any:
        read_on.append(threading.get_ident() == test_thread)
        return get_config(*args)

    monkeypatch.setattr(compactor_module.queries, "get_config", recorded)

    async def run() -> Policy:
        registry = ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2), calls_in_flight=calls)
        service = SessionsService(registry, summarizer=_Summarizer())
        try:
            await service.compactor.set_policy("o", "s", Policy(threshold_tokens=10**12, keep_recent_tokens=3))
            await registry.close_all()  # a cold object: nothing remembered of the session
            read_on.clear()
            await service.append_many("o", "s", [AppendInput(_message("m1"), Parent.auto(), True)])
            await service.append_many("o", "s", [AppendInput(_message("m2"), Parent.auto(), True)])
            return await service.compactor.get_policy("o", "s")
        finally:
            await registry.close_all()

    policy = asyncio.run(run())
    assert policy == Policy(threshold_tokens=10**12, keep_recent_tokens=3)  # read right, then remembered
    assert read_on == [in_place, in_place]  # the first append's two reads; none after
