"""A search that fails in storage is a storage failure, not the caller's query. Every SQLite
"operational" error of the search statement was answered INVALID_ARGUMENT on the query field
(I/O errors, a full disk, a damaged store), which tells a client not to retry and a person to
look at their words; only FTS5's own complaints are about the query. The domain over a real
object file, damaged here by dropping a table the search joins."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain.errors import SessionsError
from sessions_server.domain.service import SessionsService
from sessions_server.storage.paths import object_path
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import Parent
from tests.domain.searching import search


def test_a_search_failing_in_storage_is_a_storage_failure(tmp_path: Path) -> None:
    async def run() -> tuple[str, str, str | None]:
        service = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=2)))
        try:
            text = json.dumps({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello world"}]})
            await service.append("o", "", text, Parent.auto(), from_client=True)
            assert [hit.id for hit in await search(service, "o", "", "hello")] == ["m1"]
            with sqlite3.connect(object_path(tmp_path, "o")) as damage:
                damage.execute("DROP TABLE cf_agents_session_messages")
            with pytest.raises(SessionsError) as failure:
                await search(service, "o", "", "hello")
            return type(failure.value).__name__, failure.value.reason, failure.value.metadata.get("field")
        finally:
            await service.registry.close_all()

    assert asyncio.run(run()) == ("StorageFailure", "STORAGE_FAILURE", None)
