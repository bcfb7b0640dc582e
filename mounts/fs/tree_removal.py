"""Removing a directory tree without following a symlink, including trees a sandbox wrote.

One implementation for every tree the host removes: a session's runtime directory (which its
sandbox could fill with links, FIFOs, hostile nesting and modes that lock out their owner),
and the skill store's and views' trees, which are read-only (0555) by design.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from mounts.fs.flags import DIR_FLAGS, PATH_DIR_FLAGS
from mounts.fs.nofollow import DIR_MODE, closing_fd, open_root, remove_file_at

# A removal walk keeps at most this many directory fds open; deeper subtrees are moved up.
_MAX_REMOVAL_DEPTH = 64


def remove_tree(path: Path) -> int:
    """`remove_tree_at` for a tree whose parent directory is the host's own (the skill store,
    views, the agent's releases); returns the entries removed, 0 when `path` is missing."""
    try:
        parent_fd = open_root(path.parent)
    except FileNotFoundError:
        return 0
    with closing_fd(parent_fd):
        return remove_tree_at(parent_fd, path.name)


def remove_tree_at(parent_fd: int, name: str) -> int:
    """Remove `name` below `parent_fd` with everything in it; returns the entries removed.

    Never follows a symlink (a link inside the tree is unlinked, its target untouched), is
    iterative (no recursion limit for hostile nesting) with a bounded number of open fds,
    tolerates entries vanishing under a concurrent remover, and is idempotent: a missing
    `name` removes nothing. When not running as root, a directory whose mode locks its owner
    out (a sandbox may chmod 0500 what it wrote, the store makes its trees 0555) is given back
    0700 first.
    """
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        return int(_unlink(parent_fd, name))
    top = _open_for_removal(parent_fd, name)
    if top is None:
        return int(_unlink(parent_fd, name))  # swapped for a non-directory meanwhile
    try:
        removed = _empty_tree(top)
    finally:
        os.close(top)
    return removed + int(_rmdir(parent_fd, name))


def _empty_tree(top_fd: int) -> int:
    removed = 0
    stack: list[tuple[int, str]] = [(top_fd, "")]
    try:
        while stack:
            fd, _ = stack[-1]
            subdir = None
            for entry_name, is_dir in _list(fd):
                if is_dir:
                    subdir = subdir or entry_name
                else:
                    removed += _unlink(fd, entry_name)
            if subdir is None:
                if len(stack) == 1:
                    return removed
                done_fd, done_name = stack.pop()
                os.close(done_fd)
                try:
                    removed += _rmdir(stack[-1][0], done_name)
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY:
                        raise
                    # Something was added meanwhile: the parent is listed again and we descend again.
                continue
            if len(stack) >= _MAX_REMOVAL_DEPTH:
                # Bound the open fds for arbitrarily deep trees: move the subtree up to the top.
                os.rename(subdir, f".removing-{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=top_fd)
                continue
            child = _open_for_removal(fd, subdir)
            if child is None:
                removed += _unlink(fd, subdir)
                continue
            stack.append((child, subdir))
    finally:
        for fd, _ in stack[1:]:
            os.close(fd)
    return removed


def _list(fd: int) -> list[tuple[str, bool]]:
    try:
        with os.scandir(fd) as entries:
            return [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    except PermissionError:
        os.fchmod(fd, DIR_MODE)
        with os.scandir(fd) as entries:
            return [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]


def _unlink(dir_fd: int, name: str) -> int:
    try:
        return int(remove_file_at(dir_fd, name))
    except PermissionError:
        os.fchmod(dir_fd, DIR_MODE)
        return int(remove_file_at(dir_fd, name))
    except IsADirectoryError:
        return remove_tree_at(dir_fd, name)  # swapped for a directory meanwhile


def _rmdir(dir_fd: int, name: str) -> int:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return 0
    except PermissionError:
        os.fchmod(dir_fd, DIR_MODE)
        os.rmdir(name, dir_fd=dir_fd)
    return 1


def _open_for_removal(parent_fd: int, name: str) -> int | None:
    """A directory fd for `name`, or None when it is (now) not a directory."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return None
        if exc.errno != errno.EACCES:
            raise
    # The owner locked itself out (mode 0 or 0300). O_PATH opens it without read permission
    # and still without following; chmod through /proc/self/fd reaches exactly that inode.
    path_fd = os.open(name, PATH_DIR_FLAGS, dir_fd=parent_fd)
    with closing_fd(path_fd):
        os.chmod(f"/proc/self/fd/{path_fd}", DIR_MODE)
    return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
