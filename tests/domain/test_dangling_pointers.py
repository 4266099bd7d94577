"""A message may name an attachment the object does not hold (`attachment:sha256:<hash>` written
by a client); its size counts once the payload arrives, whichever session brings it (upstream
joins the payload's size at every read). The path memo kept the sizes it had read, so row stats
and budgeted reads of the session went on without the payload after another session stored it:
a 1,000-byte budget returned 40 KB once the message was read inline. The domain over a real
object file."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def test_sizes_follow_a_payload_another_session_stores(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 117  # 29,952 bytes: 39,936 as base64
    digest = hashlib.sha256(payload).hexdigest()

    def file_part(url: str) -> dict[str, str]:
        return {"type": "file", "mediaType": "image/png", "url": url}

    pointing = {"id": "p", "role": "user", "parts": [file_part(f"attachment:sha256:{digest}")]}
    after = {"id": "q", "role": "user", "parts": [{"type": "text", "text": "after"}]}
    bringing = {
        "id": "r",
        "role": "user",
        "parts": [file_part("data:image/png;base64," + base64.b64encode(payload).decode())],
    }

    async def run() -> tuple[int, int, list[str], list[str]]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            for message in (pointing, after):
                await service.append("o", "", json.dumps(message), Parent.auto(), from_client=True)

            async def sizes() -> tuple[int, list[str]]:
                stats = await service.row_stats("o", "")
                recent = [
                    view.info.id
                    async for item in service.recent_history("o", "", 1000)
                    if isinstance(item, list)
                    for view in item
                    if view.info
                ]
                return next(stat.bytes for stat in stats if stat.id == "p"), recent

            for _ in range(3):  # read often enough to be remembered
                before, recent_before = await sizes()
            await service.append("o", "other", json.dumps(bringing), Parent.auto(), from_client=True)
            now, recent_now = await sizes()
            return before, now, recent_before, recent_now
        finally:
            await service.registry.close_all()

    before, now, recent_before, recent_now = asyncio.run(run())
    assert now - before == 39_936
    assert (recent_before, recent_now) == (["p", "q"], ["q"])
