"""The session's compaction policy, which a server with a summarizer checks after each append
that stored a message, is two point reads, once per session while the object is open. The first
append of a session, or upsert that inserts, reads them in its own write job, in its
transaction: the check after it then finds the policy remembered. Read after the write, on a
server with other calls in flight, they took a reader connection of their own, which a new
object opened for them alone. The domain over a real object file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
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


async def _append(service: SessionsService, message_id: str) -> None:
    await service.append_many("o", "s", [AppendInput(_message(message_id), Parent.auto(), True)])


async def _upsert(service: SessionsService, message_id: str) -> None:
    inserted, _ = await service.upsert("o", "s", _message(message_id), Parent.auto(), from_client=True)
    assert inserted


@pytest.mark.parametrize("write", [_append, _upsert], ids=["append", "upsert"])
@pytest.mark.parametrize("calls", [lambda: 1, lambda: 2], ids=["lone", "busy"])
def test_the_first_append_of_a_session_reads_its_policy_in_its_own_write(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    calls: Callable[[], int],
    write: Callable[[SessionsService, str], Awaitable[None]],
) -> None:
    monkeypatch.setattr(store_module, "INLINE_MAX_SECONDS", 60.0)  # however slowly this machine reads
    read_in_write: list[bool] = []
    get_config = compactor_module.queries.get_config

    def recorded(conn: Any, *args: Any) -> Any:
        read_in_write.append(conn.in_transaction and conn is store_of["o"]._writer)
        return get_config(conn, *args)

    monkeypatch.setattr(compactor_module.queries, "get_config", recorded)
    readers_opened: list[Path] = []
    connect = store_module._connect

    def counted(path: Path) -> Any:
        readers_opened.append(path)
        return connect(path)

    monkeypatch.setattr(store_module, "_connect", counted)
    store_of: dict[str, Any] = {}

    async def run() -> Policy:
        registry = ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2), calls_in_flight=calls)
        service = SessionsService(registry, summarizer=_Summarizer())
        try:
            await service.compactor.set_policy("o", "s", Policy(threshold_tokens=0, keep_recent_tokens=3))
            await registry.close_all()  # a cold object: nothing remembered of the session
            read_in_write.clear()
            async with registry.use("o") as store:
                store_of["o"] = store
                await write(service, "m1")
                await write(service, "m2")
                return await service.compactor.get_policy("o", "s")
        finally:
            await registry.close_all()

    policy = asyncio.run(run())
    assert policy == Policy(threshold_tokens=0, keep_recent_tokens=3)  # read right, then remembered
    assert read_in_write == [True, True]  # the first insert's two reads, in its write; none after
    assert readers_opened == []


def test_a_policy_set_in_the_write_batch_of_a_first_append_is_the_one_remembered(tmp_path: Path) -> None:
    """A policy stored while a session's first append is queued: whichever commits last, the
    remembered policy is the stored one (the append's read sees what commits before it)."""

    async def run() -> tuple[Policy, Policy]:
        registry = ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2), calls_in_flight=lambda: 2)
        service = SessionsService(registry, summarizer=_Summarizer())
        try:
            await service.append_many("o", "other", [AppendInput(_message("m0"), Parent.auto(), True)])
            new = Policy(threshold_tokens=10**12, keep_recent_tokens=7)
            # Sent together: the append first, the policy after it; then the other way round.
            await asyncio.gather(
                service.append_many("o", "s", [AppendInput(_message("m1"), Parent.auto(), True)]),
                service.compactor.set_policy("o", "s", new),
            )
            after_append_first = await service.compactor.get_policy("o", "s")
            newer = Policy(threshold_tokens=10**12, keep_recent_tokens=9)
            await registry.close_all()  # forgotten again
            await asyncio.gather(
                service.compactor.set_policy("o", "s", newer),
                service.append_many("o", "s", [AppendInput(_message("m2"), Parent.auto(), True)]),
            )
            return after_append_first, await service.compactor.get_policy("o", "s")
        finally:
            await registry.close_all()

    first, second = asyncio.run(run())
    assert first == Policy(threshold_tokens=10**12, keep_recent_tokens=7)
    assert second == Policy(threshold_tokens=10**12, keep_recent_tokens=9)
