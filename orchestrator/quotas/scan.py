"""The non-root fallback: a user's usage counted by a bounded walk of its places.

The walk opens directories on fds with O_NOFOLLOW and lstat()s entries (st_blocks, so a
sparse file counts what it really takes), never follows a link, never leaves the place's
filesystem and counts a hard-linked inode once. Its cost is bounded: it stops after
`max_entries` entries (the inode quota plus one is enough to know a user is over it) and then
reports a lower bound (`partial`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from mounts.fs.flags import DIR_FLAGS
from mounts.fs.nofollow import UnsafePath, open_below
from orchestrator.quotas.model import DiskUsage, QuotaMechanism


def scan_usage(
    root: Path, places: Iterable[Path], *, volume: str, bytes_limit: int, inodes_limit: int, max_entries: int
) -> DiskUsage:
    seen: set[tuple[int, int]] = set()
    used_bytes = 0
    entries = 0
    partial = False
    for place in places:
        try:
            top = open_below(root, place.relative_to(root).parts)
        except (UnsafePath, OSError):
            continue  # a place replaced by a link is not walked (nor counted)
        if top is None:
            continue
        device = os.fstat(top).st_dev
        stack = [top]
        try:
            while stack:
                fd = stack.pop()
                try:
                    with os.scandir(fd) as listing:
                        for entry in listing:
                            entries += 1
                            if entries > max_entries:
                                partial = True
                                break
                            try:
                                st = entry.stat(follow_symlinks=False)
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
                                    stack.append(os.open(entry.name, DIR_FLAGS, dir_fd=fd))
                                except OSError:
                                    pass  # swapped for a link, or locked at mode 0: not walked
                except OSError:
                    pass
                finally:
                    os.close(fd)
                if partial:
                    break
        finally:
            for fd in stack:
                os.close(fd)
        if partial:
            break
    return DiskUsage(
        volume=volume,
        mechanism=QuotaMechanism.SCAN,
        bytes_used=used_bytes,
        bytes_limit=bytes_limit,
        inodes_used=len(seen),
        inodes_limit=inodes_limit,
        partial=partial,
    )
