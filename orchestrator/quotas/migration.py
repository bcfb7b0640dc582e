"""Copying a place's existing data into its new image, byte-verified, never following a link.

The source is a directory a sandbox wrote: every entry is opened on directory fds with
O_NOFOLLOW, a regular file is re-checked on its open fd (same inode as listed), and a file
that is not the volume's own (`owner_ok`; root's only with a single link) is left out: a
sandbox that hard-linked someone else's file must not get a copy of it. The owner, not the
link count, decides: the other name may already be gone (migrated out of share/ first), so
the link count alone would let it through. Symlinks are copied as links, never followed;
FIFOs, sockets and devices are left out. Each file is hashed as it is copied; afterwards the
image side is walked and hashed again and both manifests must be equal.

Crash safety is the caller's (`volumes.py`): the source is only moved away after the verified
copy is marked done in the image, so a kill at any point loses nothing, and a new attempt
starts the copy of an unfinished place afresh.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mounts.fs.flags import DIR_FLAGS, READ_FLAGS
from mounts.fs.tree_removal import remove_tree_at
from orchestrator.crash_points import crash_point

CHUNK = 1024 * 1024
# Directories nested deeper are refused (nothing is moved): a walk holds two descriptors per
# level of the current path, and no real tree nests this deep.
MAX_DEPTH = 256
# (kind, mode, uid, gid, sha256 or link target)
Manifest = dict[str, tuple[str, int, int, int, str]]


class MigrationMismatch(RuntimeError):
    """The copy in the image is not byte-for-byte the source: nothing is moved."""


@dataclass
class CopyReport:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # relative paths left out, with why


def copy_tree(src_fd: int, dst_fd: int, *, owner_ok: Callable[[int], bool]) -> tuple[CopyReport, Manifest]:
    """Copy what is below `src_fd` into the (empty) directory `dst_fd`; returns what was copied
    and the source manifest (hashes of the bytes actually copied)."""
    report, manifest = CopyReport(), {}
    # Iterative and depth-first: a hostile tree may nest deeper than Python's recursion limit,
    # and only the directories on the current path are open (two descriptors each), so a tree
    # of more directories than the process may open descriptors is copied too.
    levels: list[_Level] = [_Level(os.dup(src_fd), os.dup(dst_fd), "", None)]
    try:
        while levels:
            level = levels[-1]
            name = next(level.names, None)
            if name is None:
                levels.pop()
                try:
                    if level.st is not None:  # owners and modes last: a 0500 directory took its entries first
                        os.fchown(level.dfd, level.st.st_uid, level.st.st_gid)
                        os.fchmod(level.dfd, stat.S_IMODE(level.st.st_mode))
                finally:
                    level.close()
                continue
            sfd, dfd, rel = level.sfd, level.dfd, level.rel
            path = f"{rel}/{name}" if rel else name
            st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if len(levels) > MAX_DEPTH:
                    raise MigrationMismatch(f"{path} nests more than {MAX_DEPTH} directories deep; nothing is moved")
                child = _open_dir(sfd, name, st)
                if child is None:
                    report.skipped.append(f"{path}: changed while copied")
                    continue
                dchild = -1
                try:
                    os.mkdir(name, 0o700, dir_fd=dfd)
                    dchild = os.open(name, DIR_FLAGS, dir_fd=dfd)
                    levels.append(_Level(child, dchild, path, st))
                except BaseException:
                    os.close(child)
                    if dchild >= 0:
                        os.close(dchild)
                    raise
                manifest[path] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, "")
            elif stat.S_ISREG(st.st_mode):
                if not (owner_ok(st.st_uid) or (st.st_uid == 0 and st.st_nlink == 1)):
                    report.skipped.append(f"{path}: a file of uid {st.st_uid} (a hard link to someone else's)")
                    continue
                digest = _copy_file(sfd, dfd, name, st)
                if digest is None:
                    report.skipped.append(f"{path}: changed while copied")
                    continue
                manifest[path] = ("file", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, digest)
                report.files += 1
                report.bytes += st.st_size
                crash_point("disk-migration-mid-copy")
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=sfd)
                os.symlink(target, name, dir_fd=dfd)
                os.chown(name, st.st_uid, st.st_gid, dir_fd=dfd, follow_symlinks=False)
                manifest[path] = ("link", 0, st.st_uid, st.st_gid, target)
            else:
                report.skipped.append(f"{path}: a {_kind(st.st_mode)}, not copied")
    finally:
        for level in levels:
            level.close()
    return report, manifest


class _Level:
    """One directory on the current path of a walk: its source and copy descriptors and the
    names still to visit."""

    def __init__(self, sfd: int, dfd: int, rel: str, st: os.stat_result | None) -> None:
        self.sfd, self.dfd, self.rel, self.st = sfd, dfd, rel, st
        self.names = iter(sorted(os.listdir(sfd)))

    def close(self) -> None:
        for fd in (self.sfd, self.dfd):
            if fd >= 0:
                os.close(fd)
        self.sfd = self.dfd = -1


def _open_dir(parent_fd: int, name: str, listed: os.stat_result) -> int | None:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino):
        os.close(fd)
        return None
    return fd


def _copy_file(sfd: int, dfd: int, name: str, listed: os.stat_result) -> str | None:
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=sfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino):
            return None  # swapped between the listing and the open
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            digest = hashlib.sha256()
            while chunk := os.read(fd, CHUNK):
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
            os.fchown(out, st.st_uid, st.st_gid)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.fsync(out)
            return digest.hexdigest()
        finally:
            os.close(out)
    finally:
        os.close(fd)


def manifest_of(root_fd: int) -> Manifest:
    """The manifest of a tree the host wrote (the image side), hashing every file again. Only
    the directories on the current path are open, as in copy_tree."""
    manifest: Manifest = {}
    stack: list[tuple[int, str, Iterator[str]]] = []
    try:
        fd = os.dup(root_fd)
        stack.append((fd, "", iter(sorted(os.listdir(fd)))))
        while stack:
            fd, rel, names = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                os.close(fd)
                continue
            path = f"{rel}/{name}" if rel else name
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                manifest[path] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, "")
                if len(stack) > MAX_DEPTH:
                    raise MigrationMismatch(f"{path} nests more than {MAX_DEPTH} directories deep")
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
                try:
                    stack.append((child, path, iter(sorted(os.listdir(child)))))
                except BaseException:
                    os.close(child)
                    raise
            elif stat.S_ISREG(st.st_mode):
                manifest[path] = ("file", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, _hash_at(fd, name))
            elif stat.S_ISLNK(st.st_mode):
                manifest[path] = ("link", 0, st.st_uid, st.st_gid, os.readlink(name, dir_fd=fd))
            else:
                manifest[path] = (_kind(st.st_mode), 0, st.st_uid, st.st_gid, "")
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return manifest


def _hash_at(dir_fd: int, name: str) -> str:
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    try:
        digest = hashlib.sha256()
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def migrate_place(src_fd: int, image_parent_fd: int, subdir: str, *, owner_ok: Callable[[int], bool]) -> CopyReport:
    """Copy the place `src_fd` into `image_parent_fd/subdir`, fresh (what an interrupted attempt
    left there is removed first), and verify it. Raises MigrationMismatch when the copy differs."""
    remove_tree_at(image_parent_fd, subdir)
    os.mkdir(subdir, 0o700, dir_fd=image_parent_fd)
    dst_fd = os.open(subdir, DIR_FLAGS, dir_fd=image_parent_fd)
    try:
        report, expected = copy_tree(src_fd, dst_fd, owner_ok=owner_ok)
        found = manifest_of(dst_fd)
    finally:
        os.close(dst_fd)
    if found != expected:
        missing = sorted(set(expected) ^ set(found)) or sorted(k for k in expected if expected[k] != found.get(k))
        raise MigrationMismatch(f"the copy of {subdir} differs from its source at {missing[:5]}")
    return report


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"
