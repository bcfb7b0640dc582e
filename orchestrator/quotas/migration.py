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
from collections.abc import Callable
from dataclasses import dataclass, field

from mounts.fs.flags import DIR_FLAGS, READ_FLAGS
from mounts.fs.tree_removal import remove_tree_at
from orchestrator.crash_points import crash_point

CHUNK = 1024 * 1024
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
    # Iterative: a hostile tree may nest deeper than Python's recursion limit.
    stack: list[tuple[int, int, str]] = [(os.dup(src_fd), os.dup(dst_fd), "")]
    dirs_to_finish: list[tuple[int, os.stat_result]] = []
    try:
        while stack:
            sfd, dfd, rel = stack.pop()
            try:
                for name in sorted(os.listdir(sfd)):
                    path = f"{rel}/{name}" if rel else name
                    st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        child = _open_dir(sfd, name, st)
                        if child is None:
                            report.skipped.append(f"{path}: changed while copied")
                            continue
                        os.mkdir(name, 0o700, dir_fd=dfd)
                        dchild = os.open(name, DIR_FLAGS, dir_fd=dfd)
                        manifest[path] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, "")
                        dirs_to_finish.append((os.dup(dchild), st))
                        stack.append((child, dchild, path))
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
                os.close(sfd)
                os.close(dfd)
        # Owners and modes last: a 0500 directory must still take its entries first.
        for dfd, st in reversed(dirs_to_finish):
            os.fchown(dfd, st.st_uid, st.st_gid)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
    finally:
        for sfd, dfd, _ in stack:
            os.close(sfd)
            os.close(dfd)
        for dfd, _ in dirs_to_finish:
            try:
                os.close(dfd)
            except OSError:
                pass
    return report, manifest


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
    """The manifest of a tree the host wrote (the image side), hashing every file again."""
    manifest: Manifest = {}
    stack = [(os.dup(root_fd), "")]
    while stack:
        fd, rel = stack.pop()
        try:
            for name in sorted(os.listdir(fd)):
                path = f"{rel}/{name}" if rel else name
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    manifest[path] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, "")
                    stack.append((os.open(name, DIR_FLAGS, dir_fd=fd), path))
                elif stat.S_ISREG(st.st_mode):
                    manifest[path] = ("file", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, _hash_at(fd, name))
                elif stat.S_ISLNK(st.st_mode):
                    manifest[path] = ("link", 0, st.st_uid, st.st_gid, os.readlink(name, dir_fd=fd))
                else:
                    manifest[path] = (_kind(st.st_mode), 0, st.st_uid, st.st_gid, "")
        finally:
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
