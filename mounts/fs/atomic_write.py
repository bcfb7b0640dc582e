"""Writing files so that a reader never sees half of one and a crash never loses a rename.

`replace_file_at` is the one write-to-temp-then-rename of the host: the bytes go to a fresh
name in the same directory (O_EXCL|O_NOFOLLOW, so a planted entry is never written through),
get their owner and mode on the descriptor (never a path-based chown), are fsynced, renamed
over `name`, and the directory is fsynced so that the rename survives a power loss.
`replace_symlink_at` does the same for a symlink (a new link under a temporary name, renamed
over the old one). Everything works relative to a directory fd from `nofollow.py`.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from mounts.fs.flags import CREATE_FLAGS, ROOT_FLAGS
from mounts.fs.nofollow import UnsafePath, kind_of, closing_fd, remove_file_at

FILE_MODE = 0o600
TEMP_SUFFIX = ".tmp"

Owner = tuple[int, int]  # (uid, gid) for fchown; -1 leaves one of them as it is


def temp_name(name: str) -> str:
    """A hidden, unguessable sibling of `name` (`.{name}.{hex}.tmp`); sweepers know the shape."""
    return f".{name}.{secrets.token_hex(6)}{TEMP_SUFFIX}"


def write_new_file_at(dir_fd: int, name: str, data: bytes, *, mode: int = FILE_MODE, owner: Owner | None = None) -> None:
    """Create `name` (it must not exist), write `data`, set owner and mode, fsync.

    Created 0600 and only then given `mode` and `owner`, so the file is never wider than that
    while it is incomplete (the umask cannot widen it, and `fchmod` also undoes any narrowing).
    """
    fd = os.open(name, CREATE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    with closing_fd(fd):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)  # after fchown: changing the owner may clear setuid/setgid bits
        os.fsync(fd)


def replace_file_at(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int = FILE_MODE,
    owner: Owner | None = None,
    temp_dir_fd: int | None = None,
) -> None:
    """Atomically make `name` hold `data`: temp file, fsync, rename, directory fsync.

    The temp file is a sibling of `name`, or sits in `temp_dir_fd` (same filesystem) for a
    caller whose crash leftovers must land in a directory its own sweeper empties. Refuses
    (UnsafePath) when `name` exists and is not a regular file: a symlink, a FIFO or a
    directory there means someone else wrote this directory, and we say so instead of
    silently replacing it.
    """
    try:
        current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        current = None
    if current is not None and not stat.S_ISREG(current.st_mode):
        raise UnsafePath(name, f"expected a regular file, found {kind_of(current.st_mode)}; refused")
    temp, temp_fd = temp_name(name), dir_fd if temp_dir_fd is None else temp_dir_fd
    try:
        write_new_file_at(temp_fd, temp, data, mode=mode, owner=owner)
        os.rename(temp, name, src_dir_fd=temp_fd, dst_dir_fd=dir_fd)
    except BaseException:
        remove_file_at(temp_fd, temp)
        raise
    os.fsync(dir_fd)  # the rename itself survives a power loss


def replace_symlink_at(dir_fd: int | None, name: str, target: str, *, temp: str) -> None:
    """Point the symlink `name` at `target` in one step: readers resolve the old target or the
    new one, never none. `temp` is the caller's temporary name (its sweeper knows it). rename(2)
    replaces a symlink or a file; over a directory it fails (EISDIR), leaving the directory.
    `dir_fd` None: `name` and `temp` are paths in a directory only the host writes (the views'
    hot path saves opening it once more)."""
    os.symlink(target, temp, dir_fd=dir_fd)
    try:
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        remove_file_at(dir_fd, temp)
        raise


def fsync_dir(path: Path) -> None:
    """Make the entries of a host-owned directory (a rename into or out of it) durable."""
    with closing_fd(os.open(path, ROOT_FLAGS)) as fd:
        os.fsync(fd)
