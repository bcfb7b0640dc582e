"""A file's bytes on their way into a directory, written in pieces, never held whole.

`spool_at(dir_fd)` creates a hidden temp file there (`temp_name`, O_EXCL|O_NOFOLLOW: a
planted entry is never written through) and yields a `FileSpool`: a file-like sink (`write`,
and `seek(0)` + `truncate()` to start over, as a retried transfer does) that hashes and
counts what comes and keeps the first `head_bytes` (for sniffing a type). `commit_at(name)`
gives it its owner and mode on the descriptor, fsyncs it and renames it into place; whatever
was not committed is removed when the block ends (a killed process leaves a temp name the
directory's sweeper knows).

A `meter` (optional) is told of every change of the spool's size before it happens: `+n`
before `n` bytes are written (it may refuse by raising a `SpoolWriteFailed`, which stops the
transfer as a full disk does), `-size` when the spool starts over.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mounts.fs.atomic_write import FILE_MODE, Owner, temp_name
from mounts.fs.nofollow import remove_file_at

# Read as well as written: a spool may be read back (e.g. streamed out) before it is renamed.
SPOOL_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SpoolWriteFailed(Exception):
    """Writing the spool failed (a full disk, a quota). Not an OSError on purpose: a sink's
    failure must not pass for the failure of the connection it copies from."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.errno = error.errno

    @property
    def no_space(self) -> bool:
        return self.errno in (errno.ENOSPC, errno.EDQUOT)


Meter = Callable[[int], None]


class FileSpool:
    def __init__(self, dir_fd: int, name: str, fd: int, head_bytes: int, meter: Meter | None = None) -> None:
        self.dir_fd, self.name, self.fd = dir_fd, name, fd
        self._head_bytes = head_bytes
        self.meter = meter
        self.size = 0
        self.truncate()

    def write(self, data: bytes) -> int:
        if self.meter is not None:
            self.meter(len(data))
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            raise SpoolWriteFailed(exc) from exc
        self._sha.update(data)
        self.size += len(data)
        if len(self.head) < self._head_bytes:
            self.head += data[: self._head_bytes - len(self.head)]
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return os.lseek(self.fd, offset, whence)

    def truncate(self, size: int = 0) -> int:
        if size != 0:
            raise ValueError("a spool only starts over")
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        if self.meter is not None and self.size:
            self.meter(-self.size)
        self._sha = hashlib.sha256()
        self.size = 0
        self.head = b""
        return 0

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    def commit_at(self, name: str, *, mode: int | None = None, owner: Owner | None = None) -> None:
        """Rename the spool to `name` in its directory, durably; owner and mode are set on
        the descriptor first (never through a path), the mode after the owner (changing the
        owner may clear setuid/setgid bits)."""
        if owner is not None:
            os.fchown(self.fd, *owner)
        if mode is not None:
            os.fchmod(self.fd, mode)
        os.fsync(self.fd)
        os.rename(self.name, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)  # the rename survives a power loss


@contextmanager
def spool_at(
    dir_fd: int, head_bytes: int = 0, *, label: str = "spool", meter: Meter | None = None
) -> Iterator[FileSpool]:
    """A spool in `dir_fd` (the caller keeps `dir_fd` open for the block); its temp file is
    removed when the block ends unless it was committed."""
    name = temp_name(label)
    fd = os.open(name, SPOOL_FLAGS, FILE_MODE, dir_fd=dir_fd)
    try:
        yield FileSpool(dir_fd, name, fd, head_bytes, meter)
    finally:
        os.close(fd)
        remove_file_at(dir_fd, name)  # gone already when committed
