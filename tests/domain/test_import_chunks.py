"""An import's chunks (`domain.service.Importer`) over a real object file, no gRPC: messages that
arrive while one of the import's writes is under way go to the writer as soon as it is done."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.service import SessionsService
from sessions_server.storage.feed import ChangeEvent
from sessions_server.storage.registry import ObjectRegistry

GUARD_SECONDS = 30.0  # a failure guard on the feed, never a synchronisation device


def text(message_id: str) -> str:
    return f'{{"id":"{message_id}","role":"user","parts":[{{"type":"text","text":"{message_id}"}}]}}'


def test_messages_received_during_a_write_follow_it_without_waiting_for_more(tmp_path: Path) -> None:
    """The first message goes to the writer at once; the next two arrive before its write has
    run, so they wait. Once it is done they are written, though no further message comes and
    the stream has not ended (held back until then, they would never be)."""

    async def run() -> list[str]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            async with service.registry.use("imp") as store:
                subscription = store.feed.subscribe(None, 0)
                async with service.importer("imp", "") as importer:
                    await importer.add(text("m0"), None, 1)
                    await importer.add(text("m1"), "m0", 2)
                    await importer.add(text("m2"), "m1", 3)
                    written: list[str] = []
                    while len(written) < 3:
                        event = await subscription.next(timeout=GUARD_SECONDS)
                        assert isinstance(event, ChangeEvent), f"only {written} written while the stream is open"
                        assert event.message_info is not None
                        written.append(event.message_info.id)
                    return written
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == ["m0", "m1", "m2"]
