"""Staging and trash directories owned by a live process, and removing those whose owner died.

A writer holds an exclusive flock on its staging (or trash) directory for as long as it works
in it. A directory nobody holds a lock on belongs to a process that was killed: the next
writer (or the GC) removes it. flock locks go away with the process, even after `kill -9`.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mounts.fs.flags import DIR_FLAGS
from mounts.fs.lock import acquire
from mounts.fs.tree_removal import remove_tree

STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"
LEFTOVER_PREFIXES = (STAGING_PREFIX, TRASH_PREFIX)


def _lock_dir(path: Path, *, blocking: bool) -> int | None:
    fd = os.open(path, DIR_FLAGS)
    try:
        if not acquire(fd, blocking=blocking):
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def owned_staging(path_for: Callable[[str], Path], mode: int = 0o700) -> Iterator[Path]:
    """Create a fresh directory at `path_for(token)` and hold its lock until the block ends.

    Retries when a cleaner removed the directory between its creation and the lock.
    """
    for _ in range(10):
        path = path_for(secrets.token_hex(8))
        os.mkdir(path, mode)
        try:
            fd = _lock_dir(path, blocking=True)
        except FileNotFoundError:
            continue
        assert fd is not None
        try:
            still_there = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            still_there = False
        if not still_there:
            os.close(fd)
            continue
        try:
            yield path
        finally:
            os.close(fd)
        return
    raise RuntimeError("could not create a staging directory")


def hold(path: Path) -> int:
    """Lock an existing directory (before renaming it to trash); close the fd to release."""
    fd = _lock_dir(path, blocking=True)
    assert fd is not None
    return fd


def remove_abandoned(directory: Path, prefixes: tuple[str, ...] = LEFTOVER_PREFIXES) -> int:
    """Remove the leftover directories in `directory` whose owner is gone; count them."""
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        if not name.startswith(prefixes):
            continue
        path = directory / name
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                os.unlink(path)  # a leftover temporary symlink or file: nobody locks those
                removed += 1
                continue
            fd = _lock_dir(path, blocking=False)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if fd is None:
            continue  # its owner is alive
        try:
            remove_tree(path)
            removed += 1
        finally:
            os.close(fd)
    return removed
