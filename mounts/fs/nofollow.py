"""Opening and reading below a trusted root without ever following a symlink.

A path below the root is walked one component at a time on directory file descriptors,
each component opened with `O_NOFOLLOW` (and `O_DIRECTORY` for directories). A symlink
planted anywhere below the root is therefore refused, not followed, and there is no
check-then-open window to race (the CVE-2018-15664 class): the open *is* the check.

Directories are created 0700 by `mkdir` with that mode, so nothing is ever wider than that,
not even for an instant. Writing is `atomic_write.py`'s, removing trees `tree_removal.py`'s.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from mounts.fs.flags import DIR_FLAGS, READ_FLAGS, ROOT_FLAGS

DIR_MODE = 0o700


class UnsafePath(Exception):
    """Something below the root is not what it must be (a symlink, a FIFO, a hard link...)."""

    def __init__(self, component: str, reason: str) -> None:
        super().__init__(f"{component}: {reason}")
        self.component = component
        self.reason = reason


def kind_of(mode: int) -> str:
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
        found = kind_of(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
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
    return os.open(root, ROOT_FLAGS)


def open_dir_at(parent_fd: int, name: str, *, create: bool = False) -> int | None:
    """`name` below `parent_fd` as a directory fd; None when it is missing and not `create`."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
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
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(parent_fd, name, "a directory") from None
        raise
    if created and stat.S_IMODE(os.fstat(fd).st_mode) != DIR_MODE:
        # The umask can only have narrowed mkdir's 0700 (never widened it): restore exactly 0700.
        os.fchmod(fd, DIR_MODE)
    return fd


def open_dirs(root_fd: int, parts: Sequence[str], *, create: bool = False) -> int | None:
    """Walk `parts` below `root_fd`, each component without following symlinks; the new fd of
    the last one, or None when one is missing and not `create`."""
    return _walk(os.dup(root_fd), parts, create=create)


def open_below(root: Path, parts: Sequence[str], *, create: bool = False) -> int | None:
    """`open_dirs` from the trusted root `root` itself (one descriptor less to open and close)."""
    return _walk(open_root(root), parts, create=create)


def _walk(fd: int, parts: Sequence[str], *, create: bool) -> int | None:
    """Walk from `fd`, which this consumes (closes)."""
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


def open_regular_at(dir_fd: int, name: str, *, owner_uid: int | None = None) -> int | None:
    """`name` opened for reading (the caller closes it), or None when missing.

    Only a regular file with at most one link (and of `owner_uid`, when given) is opened;
    anything else raises `UnsafePath`. A planted FIFO does not make the open wait: the open is
    non-blocking and the check is made on the descriptor, so there is no window to race.
    (O_NONBLOCK changes nothing for reading a regular file, so the descriptor stays as opened.)
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        # ELOOP: a symlink (O_NOFOLLOW); ENXIO: a socket; EISDIR: a directory on some filesystems.
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _refusal(dir_fd, name, "a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(name, f"expected a regular file, found {kind_of(info.st_mode)}; refused")
        if info.st_nlink > 1:
            # Our writes always rename a fresh file into place; a second link was planted (a
            # hard link to a file the sandbox may not read itself). 0 is fine: replaced since
            # we opened it, and we read the complete old version.
            raise UnsafePath(name, f"has {info.st_nlink} hard links; refused")
        if owner_uid is not None and info.st_uid != owner_uid:
            raise UnsafePath(name, f"belongs to uid {info.st_uid}, not {owner_uid}; refused")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file_at(dir_fd: int, name: str) -> bytes | None:
    """The bytes of a regular, singly linked file; None when missing. Anything else is refused."""
    fd = open_regular_at(dir_fd, name)
    if fd is None:
        return None
    with closing_fd(fd):
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    return b"".join(chunks)


def remove_file_at(dir_fd: int | None, name: str) -> bool:
    """Unlink `name` (a symlink is unlinked, never followed). False when it was missing.
    (`dir_fd` None: `name` is a path.)"""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True
