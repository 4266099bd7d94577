"""The Python client's public surface: pinned, and identical between sync and asyncio."""

from __future__ import annotations

import inspect

import sessions_client
import sessions_client.aio as aio

EXPECTED_EXPORTS = {
    "AUTO",
    "DEFAULT_RETRY_POLICY",
    "AppendResult",
    "AsyncMirror",
    "Attachment",
    "ChangeEvent",
    "CompactionPlan",
    "CompactionPolicy",
    "CompactionRecord",
    "ImportItem",
    "ImportResult",
    "Message",
    "Mirror",
    "ObjectHandle",
    "ObjectStats",
    "VacuumReport",
    "RecentHistory",
    "RetryNotice",
    "RetryPolicy",
    "RowStat",
    "SearchResult",
    "SessionHandle",
    "SessionsClient",
    "SessionsError",
    "TlsConfig",
    "UpsertResult",
}


def _public_methods(cls: type) -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(member).parameters)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_exports_are_pinned() -> None:
    assert set(sessions_client.__all__) == EXPECTED_EXPORTS
    for name in EXPECTED_EXPORTS:
        assert hasattr(sessions_client, name)


def test_asyncio_handles_mirror_the_blocking_ones() -> None:
    sync_session = _public_methods(sessions_client.SessionHandle)
    async_session = _public_methods(aio.SessionHandle)
    assert set(sync_session) == set(async_session)
    for name, params in async_session.items():
        assert params == sync_session[name], name
    assert _public_methods(sessions_client.ObjectHandle) == _public_methods(aio.ObjectHandle)
    clients = _public_methods(sessions_client.SessionsClient)
    assert clients == _public_methods(aio.SessionsClient)
    assert clients["with_options"] == ["self", "timeout", "retry", "on_retry"]


def test_issue_two_method_names_exist() -> None:
    names = {
        "append_message",
        "append_messages",
        "update_message",
        "upsert_message",
        "delete_messages",
        "clear_messages",
        "import_message",
        "import_messages",
        "get_message",
        "get_latest_leaf",
        "get_branches",
        "history",
        "history_batches",
        "get_history",
        "get_recent_history",
        "get_history_row_stats",
    }
    assert names <= set(_public_methods(sessions_client.SessionHandle))
