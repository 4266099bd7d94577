"""The server keeps large buffers on glibc's heap instead of mapping fresh memory for each one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessions_server import allocator
from tests.e2e.conftest import ServerProcess

pytestmark = pytest.mark.skipif(not allocator.running_on_glibc(), reason="the settings are glibc's")

# In a fresh interpreter: optionally tune, then report how many bytes glibc holds in mappings of
# their own (mallinfo2's hblkhd) while one 5 MiB buffer is alive.
_PROBE = """
import ctypes, sys
from sessions_server import allocator

class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = allocator.reuse_large_buffers() if sys.argv[1] == "tune" else None
before = libc.mallinfo2().hblkhd
buffer = bytearray(5 * 1024 * 1024)
print(applied, libc.mallinfo2().hblkhd - before)
"""


def _probe(mode: str, **env: str) -> tuple[str, int]:
    base = {k: v for k, v in os.environ.items() if not allocator.operator_tuned_malloc({k: v})}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], env={**base, **env}, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def test_a_large_buffer_comes_from_the_heap_once_tuned() -> None:
    assert _probe("tune") == ("True", 0)
    applied, mapped = _probe("leave")  # glibc's default: a mapping of its own
    assert applied == "None" and mapped >= 5 * 1024 * 1024


def test_the_operators_malloc_settings_win() -> None:
    for env in ({"MALLOC_TRIM_THRESHOLD_": "131072"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}):
        applied, mapped = _probe("tune", **env)
        assert applied == "False" and mapped >= 5 * 1024 * 1024, env
    assert not allocator.operator_tuned_malloc({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"})


def test_the_server_tunes_its_allocator_at_start(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "--log-level", "INFO").start()
    try:
        assert any("malloc: buffers up to 32 MiB come from the heap" in line for line in server.startup), server.startup
    finally:
        server.stop()
