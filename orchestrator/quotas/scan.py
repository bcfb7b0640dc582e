"""The non-root fallback: a user's usage counted by a bounded walk of its places.

The walk opens directories on fds with O_NOFOLLOW and lstat()s entries (st_blocks, so a
sparse file counts what it really takes), never follows a link, never leaves the place's
filesystem and counts a hard-linked inode once. Its cost is bounded: it stops after
`max_entries` entries (the inode quota plus one is enough to know a user is over it) and then
reports a lower bound (`partial`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from mounts.fs.flags import DIR_FLAGS
from mounts.fs.nofollow import UnsafePath, open_below
from orchestrator.quotas.model import DiskUsage, QuotaMechanism

MAX_DEPTH = 256  # directories the walk holds open at most (one per level of the current path)


def _names(fd: int) -> Iterator[str]:
    return iter(os.listdir(fd))


def scan_usage(
    root: Path, places: Iterable[Path], *, volume: str, bytes_limit: int, inodes_limit: int, max_entries: int
) -> DiskUsage:
    seen: set[tuple[int, int]] = set()
    used_bytes = 0
    entries = 0
    partial = too_deep = False
    for place in places:
        try:
            top = open_below(root, place.relative_to(root).parts)
        except (UnsafePath, OSError):
            continue  # a place replaced by a link is not walked (nor counted)
        if top is None:
            continue
        device = os.fstat(top).st_dev
        # Depth-first, only the directories on the current path open: a descriptor for every
        # directory still to visit ran a wide tree past the process's limit, and what could not
        # be opened went uncounted (a way under the quota, and EMFILE for the whole server).
        try:
            levels = [(top, _names(top))]
        except OSError:
            os.close(top)
            continue
        try:
            while levels and not partial:
                fd, names = levels[-1]
                name = next(names, None)
                if name is None:
                    levels.pop()
                    os.close(fd)
                    continue
                entries += 1
                if entries > max_entries:
                    partial = True
                    break
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if st.st_dev != device:
                    continue  # another filesystem mounted below: not this place's
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    used_bytes += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    try:
                        if len(levels) >= MAX_DEPTH:
                            raise OSError(errno.EMFILE, "deeper than the walk holds open")
                        child = os.open(name, DIR_FLAGS, dir_fd=fd)
                        try:
                            levels.append((child, _names(child)))
                        except OSError:
                            os.close(child)
                            raise
                    except OSError as exc:
                        if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                            continue  # swapped for a link, or locked at mode 0: not walked
                        # What is below cannot be counted: it counts as over the quota (a way
                        # under it otherwise), and nesting less deeply gets it counted.
                        partial = too_deep = True
                        break
        finally:
            for fd, _names_left in levels:
                os.close(fd)
        if partial:
            break
    return DiskUsage(
        volume=volume,
        mechanism=QuotaMechanism.SCAN,
        bytes_used=used_bytes,
        bytes_limit=bytes_limit,
        inodes_used=max(len(seen), inodes_limit + 1) if too_deep else len(seen),
        inodes_limit=inodes_limit,
        partial=partial,
    )
