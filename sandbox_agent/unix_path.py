"""Unix socket paths of any length: `sun_path` holds 108 bytes, a data dir may be deeper.

A socket is bound or connected by its path, and a path past the limit fails with "AF_UNIX
path too long" (a data dir 150 characters deep, a test tree under a long temporary root).
Through an fd of the socket's directory the same socket is `/proc/self/fd/{fd}/{name}`, a few
dozen bytes whatever the directory's depth; the fd is held only for the bind or connect.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

SUN_PATH_MAX = 107  # 108 bytes with the terminating NUL


@contextmanager
def reachable(path: str) -> Iterator[str]:
    """A path to bind or connect `path` by: itself when it fits, else through its directory."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield path
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)
