"""Usage counted by a bounded walk: a user's places (the non-root fallback), and a shared place's
usage per file owner (each member's share of share/ or a group workspace, any mechanism).

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
from dataclasses import dataclass, field
from pathlib import Path

from mounts.fs.flags import DIR_FLAGS
from mounts.fs.nofollow import UnsafePath, closing_fd, open_below
from orchestrator.quotas.model import DiskUsage, OwnerUsage, QuotaMechanism

MAX_DEPTH = 256  # directories the walk holds open at most (one per level of the current path)


def _names(fd: int) -> Iterator[str]:
    return iter(os.listdir(fd))


@dataclass
class Walk:
    """A bounded, depth-first walk of directory trees on fds: what it found stays here (`seen`,
    each inode once) with whether it stopped early."""

    max_entries: int
    partial: bool = False  # stopped at `max_entries` or too deep: the figures are lower bounds
    too_deep: bool = False  # a tree nested deeper than MAX_DEPTH: what is below is not walked
    seen: set[tuple[int, int]] = field(default_factory=set)
    _count: int = 0

    def entries(self, top: int) -> Iterator[tuple[int, str, os.stat_result, bool]]:
        """(directory fd, name, lstat, left) for each entry below the directory `top` (which the
        caller keeps open) on its filesystem. A directory comes twice: when met (`left` False,
        before what it holds) and when left (`left` True, after). Each directory is opened with
        O_NOFOLLOW and must be the inode that was listed (else it is not walked); only the
        directories on the current path are open (a descriptor for every directory still to
        visit ran a wide tree past the process's limit, leaving some unwalked)."""
        device = os.fstat(top).st_dev
        try:
            levels: list[tuple[int, Iterator[str], str, os.stat_result | None]] = [(top, _names(top), "", None)]
        except OSError:
            return
        try:
            while levels and not self.partial:
                fd, names, _, _ = levels[-1]
                name = next(names, None)
                if name is None:
                    _, _, done_name, done_st = levels.pop()
                    if done_st is not None:
                        os.close(fd)
                        yield levels[-1][0], done_name, done_st, True
                    continue
                self._count += 1
                if self._count > self.max_entries:
                    self.partial = True
                    break
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if st.st_dev != device:
                    continue  # another filesystem mounted below: not this place's
                yield fd, name, st, False
                if stat.S_ISDIR(st.st_mode):
                    child = self._open_child(fd, name, st, depth=len(levels))
                    if child is not None:
                        levels.append(child)
        finally:
            for fd, _names_left, _, dir_st in levels:
                if dir_st is not None:
                    os.close(fd)

    def _open_child(
        self, fd: int, name: str, st: os.stat_result, *, depth: int
    ) -> tuple[int, Iterator[str], str, os.stat_result] | None:
        child = -1
        try:
            if depth >= MAX_DEPTH:
                raise OSError(errno.EMFILE, "deeper than the walk holds open")
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
            opened = os.fstat(child)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                os.close(child)  # swapped between the lstat and the open: not walked
                return None
            return child, _names(child), name, st
        except OSError as exc:
            if child >= 0:
                os.close(child)
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                # What is below cannot be walked: the caller learns it (`too_deep`: a scan counts
                # it as over the quota, a way under it otherwise), and nesting less deeply helps.
                self.partial = self.too_deep = True
            return None  # else swapped for a link (O_NOFOLLOW), or locked at mode 0: not walked

    def inodes(self, root: Path, places: Iterable[Path]) -> Iterator[os.stat_result]:
        """Every inode below `places` once (its lstat), the places' own directories excluded."""
        for place in places:
            try:
                top = open_below(root, place.relative_to(root).parts)
            except (UnsafePath, OSError):
                continue  # a place replaced by a link is not walked (nor counted)
            if top is None:
                continue
            with closing_fd(top):
                for _, _, st, left in self.entries(top):
                    key = (st.st_dev, st.st_ino)
                    if not left and key not in self.seen:
                        self.seen.add(key)
                        yield st
            if self.partial:
                break


def scan_usage(
    root: Path, places: Iterable[Path], *, volume: str, bytes_limit: int, inodes_limit: int, max_entries: int
) -> DiskUsage:
    walk = Walk(max_entries)
    used_bytes = sum(st.st_blocks * 512 for st in walk.inodes(root, places))
    inodes = len(walk.seen)
    return DiskUsage(
        volume=volume,
        mechanism=QuotaMechanism.SCAN,
        bytes_used=used_bytes,
        bytes_limit=bytes_limit,
        inodes_used=max(inodes, inodes_limit + 1) if walk.too_deep else inodes,
        inodes_limit=inodes_limit,
        partial=walk.partial,
    )


def usage_by_owner(root: Path, place: Path, *, max_entries: int) -> tuple[dict[int, OwnerUsage], bool]:
    """A shared place's bytes and files per owning uid (a hard-linked inode counts once, for its
    owner), and whether the walk stopped at its bound (`partial`: lower bounds)."""
    walk = Walk(max_entries)
    owners: dict[int, OwnerUsage] = {}
    for st in walk.inodes(root, [place]):
        held = owners.get(st.st_uid, OwnerUsage(0, 0))
        owners[st.st_uid] = OwnerUsage(held.bytes_used + st.st_blocks * 512, held.inodes_used + 1)
    return owners, walk.partial
