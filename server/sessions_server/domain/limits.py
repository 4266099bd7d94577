"""Every configurable limit in one place, each with its unit in its name and its default.

A limit that is exceeded fails the call with RESOURCE_EXHAUSTED (LimitExceeded) or, for
malformed sizes, INVALID_ARGUMENT, and the ErrorInfo names the limit and its value.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions_server.domain.errors import InvalidArgument, LimitExceeded

GIB = 1024 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    # Largest message JSON accepted from `source=client` writes (0: no limit, as upstream).
    max_client_message_bytes: int = 32 * 1024 * 1024
    # Largest object file (database + WAL) that still accepts writes; a Durable Object's 10 GB.
    max_object_bytes: int = 10 * GIB
    # Concurrent Subscribe streams on one object.
    max_subscribers_per_object: int = 256
    # Concurrent streaming calls (server- or client-streaming) on the whole server.
    max_concurrent_streams: int = 4096
    # Longest message id: ids travel beside every frame, which must stay under 4 MiB.
    max_message_id_bytes: int = 16 * 1024
    # Longest compaction summary: overlays are listed and streamed whole.
    max_summary_bytes: int = 1024 * 1024


def check_size(value: str, limit: int, what: str, limit_name: str, field: str) -> None:
    """INVALID_ARGUMENT when a text is longer (UTF-8 bytes) than a limit."""
    if len(value) * 4 <= limit:
        return
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise InvalidArgument(
            f"{what} is {size} bytes; the limit is {limit} bytes ({limit_name})",
            reason="LIMIT_EXCEEDED",
            field=field,
            limit=limit_name,
            limit_value=str(limit),
        )


def exceeded(what: str, limit_name: str, limit_value: int, unit: str = "") -> LimitExceeded:
    suffix = f" {unit}" if unit else ""
    return LimitExceeded(
        f"{what}: the limit is {limit_value}{suffix} ({limit_name})",
        limit=limit_name,
        limit_value=str(limit_value),
    )
