"""Give the memory of large payloads back to the OS when they are freed.

glibc serves an allocation above its mmap threshold (128 KiB at first) with a mapping of its
own, returned at free; but after such a free it raises the threshold to that size (up to
32 MiB), so the next 20 MB payloads come from the heaps of the worker threads' arenas, which
keep the pages. Measured with bench/memory.py: 20 concurrent 20 MB send_files, with at most 4
held at once, still left the server at 672 MiB instead of 157 MiB. Setting the threshold
explicitly turns that adjustment off (mallopt(3)): a payload buffer is one mapping, unmapped
when the transfer is done. Smaller allocations (everything on the warm path, and a 1 MiB
send_file, which a 1 MiB threshold made 2 ms slower) are unaffected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

from orchestrator.log import kv

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # from <malloc.h>
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024


def return_large_buffers(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process; False (and nothing
    changed) where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("mallopt is not available; large buffers stay with the allocator %s", kv(libc=name))
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
