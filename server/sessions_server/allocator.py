"""The C allocator's settings for a process that handles multi-megabyte messages.

glibc's `malloc` serves a request above its mmap threshold with a fresh mapping and unmaps it on
free, and hands the top of its heap back to the kernel once more than its trim threshold is free
there. Both thresholds start small (128 KiB); glibc moves the first up to the size of the last
mapped block freed, and the second to twice that. A 5 MB message passes through several
buffers of its size on the way to disk (the received pieces, the joined text, the parsed value,
its canonical JSON's bytes), and with the defaults most of them are new memory that the kernel
zeroes page by page. The server took 7,000-9,000 page faults per
5 MB append and read, against 3,300-5,800 with the thresholds below; with servers alternated
after a history workload, the defaults made 5 MB appends 6.5% slower (14 of 16 blocks) and
5 MB reads 44% slower (16 of 16).

With these thresholds, buffers of up to 32 MiB (the most glibc's own adjustment would allow) come
from the heap, and up to 64 MiB of freed heap stays with the process for the next large message.
64 and 128 MiB measured the same for 5 MB appends and reads. The cost is resident memory kept
after a burst of large messages until the server goes idle (`release_free_heap`); messages of
ordinary size never reach either bound.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Mapping

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3

# An operator who set any of these has tuned malloc already; the server leaves it as they chose.
_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def operator_tuned_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment already sets glibc's malloc thresholds."""
    if any(name in environ for name in _OPERATOR_SETTINGS):
        return True
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def running_on_glibc() -> bool:
    """Whether the C library this process runs on is glibc. Asked of the library itself:
    `platform.libc_ver` reads the interpreter's executable, which names the library it was
    linked against, not the one loaded."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):  # the name unknown here, or no confstr at all
        return False


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not running_on_glibc():
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def reuse_large_buffers() -> bool:
    """Raises glibc's mmap and trim thresholds for this process. Returns whether it did: not on
    another C library, and not when the operator's environment sets malloc's thresholds."""
    libc = _glibc()
    if libc is None or operator_tuned_malloc():
        return False
    # mallopt returns 1 on success; each setting also stops glibc from moving the thresholds.
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def release_free_heap() -> bool:
    """Hands the heap's free pages back to the kernel (glibc's `malloc_trim(0)`), wherever they
    lie, not only at its top. Returns whether any were. For a server gone idle: the thresholds
    keep up to 64 MiB of freed heap (and freed pieces between live blocks stay resident too)
    only for the next large message. Takes a few milliseconds, holding malloc's locks."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))
