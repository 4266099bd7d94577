"""The server keeps large buffers on glibc's heap instead of mapping fresh memory for each one,
and hands the freed heap back to the operating system once it goes idle."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sessions_client import SessionsClient
from sessions_server import allocator
from tests.deploy.support import free_port
from tests.e2e.conftest import ServerProcess
from tests.reliability.support import wait_until

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


# In a fresh interpreter, tuned: eight 5 MiB buffers, written and freed, stay resident on the heap
# (40 MiB, under the 64 MiB trim threshold) until `release_free_heap`. Prints resident MiB at each
# step.
_RELEASE_PROBE = """
from sessions_server import allocator
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
assert allocator.reuse_large_buffers()
base = resident()
buffers = [bytearray(5 * 1024 * 1024) for _ in range(8)]
held = resident()
del buffers
freed = resident()
released = allocator.release_free_heap()
print(base, held, freed, resident(), released)
"""


def test_freed_heap_goes_back_to_the_system_on_release() -> None:
    base = {k: v for k, v in os.environ.items() if not allocator.operator_tuned_malloc({k: v})}
    out = subprocess.run(
        [sys.executable, "-c", _RELEASE_PROBE], env=base, capture_output=True, text=True, check=True
    ).stdout.split()
    start, held, freed, after, released = (*map(int, out[:4]), out[4])
    assert held - start >= 40 and freed - start >= 35  # kept for the next large message
    assert released == "True" and freed - after >= 35, out


def _heap_releases(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(r"^sessions_heap_releases_total (\S+)$", body, re.MULTILINE)
    assert match is not None, body
    return float(match.group(1))


def _resident_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) >> 10


def test_the_server_hands_freed_heap_back_once_idle(tmp_path: Path) -> None:
    """After a 5 MB append the server, idle for 0.2 s, releases what the message's buffers
    left free on the heap; the next quiet spell after the next large append does it again."""
    port = free_port()
    server = ServerProcess(tmp_path, "--idle-seconds", "0.2", "--metrics-listen", f"127.0.0.1:{port}").start()
    assert server.proc is not None
    text = "x" * (5 * 1024 * 1024)
    try:
        with SessionsClient(server.address) as client:
            session = client.object("large").session()
            for round_number in (1, 2):
                session.append_message(
                    {"id": f"m{round_number}", "role": "user", "parts": [{"type": "text", "text": text}]}
                )
                busy = _resident_mib(server.proc.pid)  # before the 0.2 s of quiet
                assert wait_until(lambda n=round_number: _heap_releases(port) >= n, timeout=30), round_number
                assert _heap_releases(port) == round_number
                assert _resident_mib(server.proc.pid) <= busy - 10, (busy, _resident_mib(server.proc.pid))
    finally:
        server.stop()
