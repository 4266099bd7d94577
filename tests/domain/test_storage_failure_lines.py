"""Storage failures are logged at ERROR once per object a minute, and at most MAX_FAILURE_LINES
a minute for all objects together: a full disk fails every object written to, and with thousands
of objects in use that was thousands of ERROR lines a minute (80 in 0.3 s for 120 objects;
observability audit, session 49). Past the bound each failure is counted, and the count is told
when the next minute's first failure is logged. The clock is the test's, so that the minutes
pass at once."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.domain import objects
from sessions_server.domain.objects import FAILURE_LOG_SECONDS, MAX_FAILURE_LINES
from sessions_server.domain.service import SessionsService
from sessions_server.storage.registry import ObjectRegistry


def test_failures_of_many_objects_are_logged_within_a_bound_and_the_rest_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_000.0]
    monkeypatch.setattr(objects.time, "monotonic", lambda: now[0])
    admin = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=1))).objects
    caplog.set_level(logging.ERROR, logger="sessions.objects")

    def lines() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.name == "sessions.objects"]

    for index in range(120):
        admin.note_storage_failure(f"key-{index}", "write", "database or disk is full")
    logged = lines()
    assert len(logged) == MAX_FAILURE_LINES
    assert all(line.startswith("storage failure: object 'key-") for line in logged)
    assert "counted, not logged one by one" in logged[-1] and "counted" not in logged[0]
    admin.note_storage_failure("key-0", "write", "database or disk is full")  # its minute is not over
    assert len(lines()) == MAX_FAILURE_LINES

    now[0] += FAILURE_LOG_SECONDS
    admin.note_storage_failure("key-0", "write", "database or disk is full")
    told = lines()[MAX_FAILURE_LINES:]
    assert len(told) == 2, told
    assert told[0].startswith(f"storage failures of {120 - MAX_FAILURE_LINES} more objects were not logged")
    assert told[1].startswith("storage failure: object 'key-0'")


def test_a_damaged_object_is_logged_past_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each damaged object is quarantined, and the operator must learn which to restore: its
    line is not held back by a full disk's failures (review of session 49)."""
    monkeypatch.setattr(objects.time, "monotonic", lambda: 1_000.0)
    admin = SessionsService(ObjectRegistry(tmp_path, ThreadPoolExecutor(max_workers=1))).objects
    caplog.set_level(logging.ERROR, logger="sessions.objects")
    for index in range(MAX_FAILURE_LINES + 5):
        admin.note_storage_failure(f"key-{index}", "write", "database or disk is full")
    admin.note_storage_failure("broken", "read", "database disk image is malformed", damaged=True)
    damaged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("object damaged: object 'broken'")]
    assert len(damaged) == 1
