"""ReadAttachment while the payload's last message is deleted. A payload is read a chunk at a
time, each its own snapshot, so a delete between two chunks can collect it: the read then ends
with NOT_FOUND, saying so, where it ended with FAILED_PRECONDITION and reason STORAGE_FAILURE
(a storage engine failure, which nothing was). The domain over a real object file."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import attachments
from sessions_server.domain.attachments import POINTER_PREFIX
from sessions_server.domain.errors import NotFound
from sessions_server.domain.service import SessionsService
from sessions_server.storage.queries import ATTACHMENT_CHUNK_BYTES
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent


def test_a_payload_deleted_between_its_chunks_ends_the_read_with_not_found(tmp_path: Path) -> None:
    payload = bytes(range(256)) * (ATTACHMENT_CHUNK_BYTES * 2 // 256 + 1)  # three chunks
    url = "data:application/octet-stream;base64," + base64.b64encode(payload).decode()
    message = {"id": "m1", "role": "user", "parts": [{"type": "file", "mediaType": "application/pdf", "url": url}]}

    async def run() -> tuple[int, str]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            await service.append("o", "", json.dumps(message), Parent.auto(), from_client=True)
            pointer = json.loads((await service.get_message("o", "", "m1", inline=False)).json)  # type: ignore[union-attr]
            digest = pointer["parts"][0]["url"].removeprefix("attachment:sha256:")
            chunks = service.read_attachment("o", digest)
            _, _, first = await anext(chunks)
            assert await service.delete("o", "", ["m1"]) == 1  # its only reference: collected
            with pytest.raises(NotFound) as gone:
                async for _ in chunks:
                    pass
            return len(first), str(gone.value)
        finally:
            await service.registry.close_all()

    first, error = asyncio.run(run())
    assert first == ATTACHMENT_CHUNK_BYTES
    assert "deleted" in error


def test_a_payload_named_many_times_is_loaded_and_encoded_once_a_read() -> None:
    """A message naming one stored payload at many places read it and encoded it at each: 60
    places of a 5 MB image held 60 base64 copies (400 MB) beside the JSON written from them. The
    places now share one encoding, and a payload named both as a URL and as data is still
    restored in each form."""
    payload = bytes(range(256)) * 40
    digest = hashlib.sha256(payload).hexdigest()
    loads: list[str] = []

    def load(wanted: str) -> tuple[str, bytes] | None:
        loads.append(wanted)
        return ("image/png", payload) if wanted == digest else None

    places = [{"type": "file", "mediaType": "image/png", "url": POINTER_PREFIX + digest} for _ in range(60)]
    places.append({"type": "file", "mediaType": "image/png", "data": POINTER_PREFIX + digest})
    places.append({"type": "file", "mediaType": "image/png", "url": POINTER_PREFIX + "0" * 64})  # unknown
    resolved = attachments.resolve({"id": "m", "role": "user", "parts": places}, load)

    urls = [part["url"] for part in resolved["parts"][:60]]
    assert urls[0] == "data:image/png;base64," + base64.b64encode(payload).decode()
    assert all(url is urls[0] for url in urls)  # one string, not sixty
    assert resolved["parts"][60]["data"] == base64.b64encode(payload).decode()
    assert resolved["parts"][61]["url"] == POINTER_PREFIX + "0" * 64  # left as it is
    assert sorted(set(loads)) == sorted([digest, "0" * 64]) and loads.count(digest) == 2  # once a form
