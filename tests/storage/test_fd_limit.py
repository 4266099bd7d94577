"""Open objects and the process's file descriptors (storage/fdlimit.py, `ObjectRegistry`).

With a soft limit of 1,024 descriptors the default number of open objects did not fit: opens
failed with "unable to open database file" (answered INTERNAL), and since no object below the
`max_open` bound is ever closed, every later open failed too, for good."""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sessions_server.storage import fdlimit
from sessions_server.storage.registry import ObjectRegistry
from sessions_server.storage.rows import OutOfDescriptors


def _descriptors_in_use() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def restored_limit() -> Iterator[tuple[int, int]]:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        yield limits
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


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
    restored_limit: tuple[int, int], tmp_path: Path
) -> None:
    """Every object stays open (the bound is far), until an open finds no descriptor left: it
    is refused as retryable, half the idle objects close, and the next open goes through."""
    executor = ThreadPoolExecutor(max_workers=2)

    async def scenario() -> None:
        registry = ObjectRegistry(tmp_path, executor, max_open=100_000)
        try:
            for index in range(10):
                async with registry.use(f"k{index}") as store:
                    await store.write(lambda ctx: None)
            assert registry.open_count == 10
            _, hard = restored_limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (_descriptors_in_use(), hard))  # one spare: too few
            with pytest.raises(OutOfDescriptors) as refused:
                async with registry.use("one-too-many"):
                    pass
            assert "retry" in str(refused.value)
            assert registry.open_count == 5
            await asyncio.gather(*registry._closes)  # the closes under way end, their descriptors free
            async with registry.use("one-too-many") as store:
                await store.write(lambda ctx: None)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, restored_limit)
            await registry.close_all()

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()


def test_a_read_that_finds_no_descriptor_for_its_connection_asks_for_a_retry(
    restored_limit: tuple[int, int], tmp_path: Path
) -> None:
    executor = ThreadPoolExecutor(max_workers=1)

    async def scenario() -> None:
        registry = ObjectRegistry(tmp_path, executor)
        try:
            async with registry.use("k") as store:
                await store.write(lambda ctx: None)
                _, hard = restored_limit
                resource.setrlimit(resource.RLIMIT_NOFILE, (_descriptors_in_use() - 1, hard))  # none spare
                with pytest.raises(OutOfDescriptors):
                    await store.read(lambda conn: conn.execute("SELECT 1").fetchone())
                resource.setrlimit(resource.RLIMIT_NOFILE, restored_limit)
                assert await store.read(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, restored_limit)
            await registry.close_all()

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()
