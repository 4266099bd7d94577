"""Python client for the Sessions service.

    from sessions_client import SessionsClient
    with SessionsClient("127.0.0.1:50051") as client:
        session = client.object("conversation-1").session()
        session.append_message({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]})
        for message in session.history():
            ...

`sessions_client.aio.SessionsClient` has the same methods as coroutines and async iterators.
"""

from sessions_client._common import (
    AUTO,
    AppendResult,
    AsyncMirror,
    Attachment,
    ChangeEvent,
    CompactionPlan,
    CompactionPolicy,
    CompactionRecord,
    ImportItem,
    ImportResult,
    Message,
    Mirror,
    ObjectStats,
    RecentHistory,
    RowStat,
    SearchResult,
    SessionsError,
    TlsConfig,
    UpsertResult,
    VacuumReport,
)
from sessions_client._retry import DEFAULT_RETRY_POLICY, RetryNotice, RetryPolicy
from sessions_client._sync import ObjectHandle, SessionHandle, SessionsClient

__all__ = [
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
    "VacuumReport",
]
