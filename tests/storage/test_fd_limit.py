"""Open objects and the process's file descriptors (storage/fdlimit.py, `ObjectRegistry`).

With a soft limit of 1,024 descriptors the default number of open objects did not fit: opens
failed with "unable to open database file" (answered INTERNAL), and since no object below the
`max_open` bound is ever closed, every later open failed too, for good."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import resource
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sessions_server.domain.errors import LimitExceeded
from sessions_server.domain.objects import ObjectAdmin
from sessions_server.storage import fdlimit
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import OutOfDescriptors


@pytest.fixture
def restored_limit() -> Iterator[tuple[int, int]]:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        yield limits
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        while _FILLERS:
            os.close(_FILLERS.pop())


def test_open_objects_are_bounded_by_the_descriptors_the_process_may_have(
    restored_limit: tuple[int, int], tmp_path: Path
) -> None:
    _, hard = restored_limit
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    executor = ThreadPoolExecutor(max_workers=2)
    try:
        registry = ObjectRegistry(tmp_path, executor, max_open=100_000)
        assert registry._max_open == fdlimit.objects_that_fit(1024) < 100_000
        within = ObjectRegistry(tmp_path, executor, max_open=10)
        assert within._max_open == 10
    finally:
        executor.shutdown()


def test_an_open_out_of_descriptors_closes_idle_objects_and_asks_for_a_retry(
    restored_limit: tuple[int, int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every object stays open (the bound is far), until an open finds no descriptor left: it
    is refused as retryable, half the idle objects close, and the next open goes through. The
    caller, perhaps one tenant of many, is not told how many objects the server has open; the
    operator's log is, once a minute at most."""

    async def scenario(registry: ObjectRegistry) -> None:
        for index in range(10):
            async with registry.use(f"k{index}") as store:
                await store.write(lambda ctx: None)
        assert registry.open_count == 10
        _limit_descriptors_to_those_in_use(restored_limit, spare=1)
        caplog.set_level(logging.WARNING, logger="sessions.storage")
        with pytest.raises(OutOfDescriptors) as refused:
            async with registry.use("one-too-many"):
                pass
        assert "retry" in str(refused.value)
        assert not re.search(r"\d", str(refused.value))
        assert registry.open_count == 5
        await asyncio.gather(*registry._closes)  # the closes under way end, their descriptors free
        _limit_descriptors_to_those_in_use(restored_limit, spare=1)
        with pytest.raises(OutOfDescriptors):
            async with registry.use("one-too-many"):
                pass
        warnings = [r.getMessage() for r in caplog.records if "no file descriptor left" in r.getMessage()]
        assert len(warnings) == 1
        assert "with 10 objects open" in warnings[0] and "--max-open-objects" in warnings[0]
        await asyncio.gather(*registry._closes)
        async with registry.use("one-too-many") as store:
            await store.write(lambda ctx: None)

    _with_registry(tmp_path, restored_limit, scenario, max_open=100_000)


def test_a_read_that_finds_no_descriptor_for_its_connection_asks_for_a_retry(
    restored_limit: tuple[int, int], tmp_path: Path
) -> None:
    async def scenario(registry: ObjectRegistry) -> None:
        async with registry.use("k") as store:
            await store.write(lambda ctx: None)
            _limit_descriptors_to_those_in_use(restored_limit, spare=0)
            with pytest.raises(OutOfDescriptors):
                await store.read(lambda conn: conn.execute("SELECT 1").fetchone())
            resource.setrlimit(resource.RLIMIT_NOFILE, restored_limit)
            assert await store.read(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)

    _with_registry(tmp_path, restored_limit, scenario)


def test_an_export_that_finds_no_descriptor_is_refused_as_a_busy_server(
    restored_limit: tuple[int, int], tmp_path: Path
) -> None:
    """As every other call's open: RESOURCE_EXHAUSTED / SERVER_BUSY, which the clients retry
    (a move's first step among them), not UNAVAILABLE / STORAGE_FAILURE."""

    async def scenario(registry: ObjectRegistry) -> None:
        async with registry.use("k") as store:
            await store.write(lambda ctx: None)
        await registry.close_all()
        _limit_descriptors_to_those_in_use(restored_limit, spare=1)
        with pytest.raises(LimitExceeded) as refused:
            async for _ in ObjectAdmin(registry).export("k", lock_for_move=True, lease_seconds=0):
                pass
        assert refused.value.reason == "SERVER_BUSY"

    _with_registry(tmp_path, restored_limit, scenario)


def _limit_descriptors_to_those_in_use(limits: tuple[int, int], *, spare: int) -> None:
    """Leaves `spare` descriptors to open. The soft limit bounds descriptor numbers, not their
    count (a new descriptor takes the lowest free number below it), and descriptors an earlier
    test closed leave free numbers below the highest in use: those are filled (until the test
    ends), so that the `spare` numbers above the highest are the only ones left, and those a
    test closes come back below the limit. Counting instead left such holes open, in a full run
    only."""
    gc.collect()  # descriptors only garbage holds would be freed, and taken, mid-test
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        highest = max(int(name) for name in os.listdir(listing) if int(name) != listing)
    finally:
        os.close(listing)
    while (filler := os.open(os.devnull, os.O_RDONLY)) < highest:
        _FILLERS.append(filler)
    os.close(filler)
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + spare, limits[1]))


_FILLERS: list[int] = []  # descriptors holding free numbers below the limit, closed after each test


def _with_registry(
    tmp_path: Path,
    limits: tuple[int, int],
    scenario: Callable[[ObjectRegistry], Awaitable[None]],
    **options: Any,
) -> None:
    executor = ThreadPoolExecutor(max_workers=2)

    async def run() -> None:
        registry = ObjectRegistry(tmp_path, executor, **options)
        try:
            await scenario(registry)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            await registry.close_all()

    try:
        asyncio.run(run())
    finally:
        executor.shutdown()
