"""Advisory file locks (flock) shared by threads and processes using one data directory.

Each acquisition opens the lock file anew: flock belongs to the open file description, so two
threads of one process exclude each other exactly like two processes do. A process killed
with the lock held releases it with its file descriptors, so a lock is also a liveness
signal: `is_held` tells whether the process that took one is still alive.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mounts.fs.flags import LOCK_FLAGS
from mounts.fs.nofollow import closing_fd


def acquire(fd: int, *, exclusive: bool = True, blocking: bool = True) -> bool:
    """flock `fd`; False only when not `blocking` and someone else holds it."""
    operation = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, operation)
    except OSError as exc:
        if blocking or exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False
    return True


def is_held(fd: int) -> bool:
    """Whether another open file description holds an exclusive lock on `fd`'s file."""
    if not acquire(fd, exclusive=False, blocking=False):
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


@contextmanager
def holding(fd: int, *, exclusive: bool = True) -> Iterator[None]:
    """Lock an already open descriptor (a directory fd, say) for the block."""
    acquire(fd, exclusive=exclusive)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextmanager
def flocked_at(dir_fd: int, name: str, *, exclusive: bool) -> Iterator[None]:
    """Hold a lock on the file `name` in `dir_fd` (created 0600, never through a symlink)."""
    with closing_fd(os.open(name, LOCK_FLAGS, 0o600, dir_fd=dir_fd)) as fd:  # closing releases it
        acquire(fd, exclusive=exclusive)
        yield


@contextmanager
def flocked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold a lock on the lock file `path` of a host-owned directory (created when missing)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with closing_fd(os.open(path, LOCK_FLAGS, 0o600)) as fd:  # closing releases it
        acquire(fd, exclusive=exclusive)
        yield
