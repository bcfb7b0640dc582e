"""Atomic placement of a directory: `renameat2(2)` with RENAME_NOREPLACE or RENAME_EXCHANGE.

Replacing a non-empty directory with `rename(2)` is impossible, and "move the old one aside,
then move the new one in" leaves an instant in which the name is missing. RENAME_EXCHANGE
swaps two names in one step: a reader sees the old tree or the new one, never neither.
Python has no wrapper; the one ctypes call lives in `sandbox_agent.syscalls` (stdlib only,
imports nothing of ours), which the agent's own race tests use too.
"""

from __future__ import annotations

import errno
import logging
import os

from mounts.log_fields import kv
from sandbox_agent.syscalls import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2

log = logging.getLogger(__name__)


def rename_noreplace(dir_fd: int, src: str, dst: str) -> None:
    """Move `src` to `dst` within one directory; FileExistsError when `dst` exists."""
    renameat2(dir_fd, src, dir_fd, dst, RENAME_NOREPLACE)


def exchange(dir_fd: int, a: str, b: str) -> None:
    """Swap the entries `a` and `b` of one directory atomically (both must exist)."""
    renameat2(dir_fd, a, dir_fd, b, RENAME_EXCHANGE)


def put_in_place(dir_fd: int, staged: str, name: str) -> bool:
    """Move the staged tree to `name`, atomically replacing what had that name, and fsync the
    directory. True when nothing had that name; otherwise the replaced tree is now under
    `staged`, where the caller deletes it. The caller serializes placements in `dir_fd`."""
    try:
        try:
            rename_noreplace(dir_fd, staged, name)
            created = True
        except FileExistsError:
            exchange(dir_fd, staged, name)
            created = False
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
        created = _place_in_two_renames(dir_fd, staged, name, exc)
    os.fsync(dir_fd)
    return created


def _place_in_two_renames(fd: int, staged: str, name: str, why: OSError) -> bool:
    # A filesystem or kernel without renameat2 flags (EINVAL/ENOSYS): under the caller's lock,
    # move the old tree aside (to the staging name's twin) and the new one in. The name is
    # missing for an instant; readers retry that like any vanished source.
    log.warning("atomic exchange unavailable, replacing in two renames %s", kv(name=name, error=why.strerror))
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(staged, name, src_dir_fd=fd, dst_dir_fd=fd)
        return True
    aside = f"{staged}.old"
    os.rename(name, aside, src_dir_fd=fd, dst_dir_fd=fd)
    os.rename(staged, name, src_dir_fd=fd, dst_dir_fd=fd)
    os.rename(aside, staged, src_dir_fd=fd, dst_dir_fd=fd)  # where the caller deletes the old tree
    return False
