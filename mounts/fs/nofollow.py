"""File operations below a trusted root that never follow a symlink.

A path below the root is walked one component at a time on directory file descriptors,
each component opened with `O_NOFOLLOW` (and `O_DIRECTORY` for directories). A symlink
planted anywhere below the root is therefore refused, not followed, and there is no
check-then-open window to race (the CVE-2018-15664 class): the open *is* the check.

Directories are created 0700 and files 0600 by `mkdir`/`open` with that mode, so nothing is
ever wider than that, not even for an instant. Files are replaced atomically: written to a
temporary name in the same directory fd, fsynced, then renamed over the old one.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
TEMP_SUFFIX = ".tmp"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a planted FIFO must fail the type check, not hang.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# A removal walk keeps at most this many directory fds open; deeper subtrees are moved up.
_MAX_REMOVAL_DEPTH = 64


class UnsafePath(Exception):
    """Something below the root is not what it must be (a symlink, a FIFO, a hard link...)."""

    def __init__(self, component: str, reason: str) -> None:
        super().__init__(f"{component}: {reason}")
        self.component = component
        self.reason = reason


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or other special file"


def _refusal(parent_fd: int, name: str, expected: str) -> UnsafePath:
    try:
        found = _kind(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
    except OSError:
        found = "something that vanished"
    return UnsafePath(name, f"expected {expected}, found {found}; refused, not followed")


@contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_root(root: Path) -> int:
    """The trusted root itself (configured by the operator), as a directory fd."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_dir_at(parent_fd: int, name: str, *, create: bool = False) -> int | None:
    """`name` below `parent_fd` as a directory fd; None when it is missing and not `create`."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as exc:
        # ELOOP: a symlink (O_NOFOLLOW); ENOTDIR: a file, or a symlink on some kernels.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(parent_fd, name, "a directory") from None
        raise
    created = True
    try:
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
    except FileExistsError:
        created = False  # a concurrent creator won; open what is there, still without following
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(parent_fd, name, "a directory") from None
        raise
    if created and stat.S_IMODE(os.fstat(fd).st_mode) != DIR_MODE:
        # The umask can only have narrowed mkdir's 0700 (never widened it): restore exactly 0700.
        os.fchmod(fd, DIR_MODE)
    return fd


def open_dirs(root_fd: int, parts: Sequence[str], *, create: bool = False) -> int | None:
    """Walk `parts` below `root_fd`, each component without following symlinks."""
    fd = os.dup(root_fd)
    for part in parts:
        try:
            child = open_dir_at(fd, part, create=create)
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def entry_exists(dir_fd: int, name: str) -> bool:
    """Whether anything (of any type, symlinks included) is called `name` in the directory."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def read_file_at(dir_fd: int, name: str) -> bytes | None:
    """The bytes of a regular, singly linked file; None when missing. Anything else is refused."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _refusal(dir_fd, name, "a regular file") from None
        raise
    with closing_fd(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(name, f"expected a regular file, found {_kind(info.st_mode)}; refused")
        if info.st_nlink > 1:
            # Our writes always rename a fresh file into place; a second link was planted.
            # (0 is fine: replaced since we opened it, and we read the complete old version.)
            raise UnsafePath(name, f"has {info.st_nlink} hard links; refused")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    return b"".join(chunks)


def replace_file_at(dir_fd: int, name: str, data: bytes) -> None:
    """Atomically replace `name` (0600 from creation) with `data`: temp file, fsync, rename."""
    try:
        current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        current = None
    if current is not None and not stat.S_ISREG(current.st_mode):
        raise UnsafePath(name, f"expected a regular file, found {_kind(current.st_mode)}; refused")
    temp = f".{name}.{secrets.token_hex(6)}{TEMP_SUFFIX}"
    fd = os.open(temp, _CREATE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    try:
        with closing_fd(fd):
            if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)  # the umask narrowed it; never wider than 0600
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        remove_file_at(dir_fd, temp)
        raise
    os.fsync(dir_fd)  # the rename itself survives a power loss


def remove_file_at(dir_fd: int, name: str) -> bool:
    """Unlink `name` (a symlink is unlinked, never followed). False when it was missing."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_tree_at(parent_fd: int, name: str) -> int:
    """Remove `name` below `parent_fd` with everything in it; returns the entries removed.

    Never follows a symlink (a link inside the tree is unlinked, its target untouched), is
    iterative (no recursion limit for hostile nesting) with a bounded number of open fds,
    tolerates entries vanishing under a concurrent remover, and is idempotent: a missing
    `name` removes nothing. When not running as root, a directory whose mode locks its owner
    out (a sandbox may chmod 0500 what it wrote) is given back 0700 first.
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
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return None
        if exc.errno != errno.EACCES:
            raise
    # The owner locked itself out (mode 0 or 0300). O_PATH opens it without read permission
    # and still without following; chmod through /proc/self/fd reaches exactly that inode.
    path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    with closing_fd(path_fd):
        os.chmod(f"/proc/self/fd/{path_fd}", DIR_MODE)
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
