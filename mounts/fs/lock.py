"""Advisory file locks (flock) shared by threads and processes using one data directory.

Each acquisition opens the lock file anew: flock belongs to the open file description, so two
threads of one process exclude each other exactly like two processes do. A process killed
with the lock held releases it with its file descriptors.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def flocked(path: Path, *, exclusive: bool) -> Iterator[None]:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock
