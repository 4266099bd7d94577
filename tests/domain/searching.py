"""Domain tests' search: every hit of `SessionsService.search_windows`, collected."""

from __future__ import annotations

from typing import Any

from sessions_server.domain.search import SearchHit
from sessions_server.domain.service import SessionsService


async def search(
    service: SessionsService, object_key: str, session_id: str, query: str, **options: Any
) -> list[SearchHit]:
    return [hit async for window in service.search_windows(object_key, session_id, query, **options) for hit in window]
