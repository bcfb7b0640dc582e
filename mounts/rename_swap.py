"""Atomic placement of a directory: `renameat2(2)` with RENAME_NOREPLACE or RENAME_EXCHANGE.

Replacing a non-empty directory with `rename(2)` is impossible, and "move the old one aside,
then move the new one in" leaves an instant in which the name is missing. RENAME_EXCHANGE
swaps two names in one step: a reader sees the old tree or the new one, never neither.
Python has no wrapper, so the syscall is made through ctypes (Linux ≥ 3.15).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(platform.machine())
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _renameat2(dir_fd: int, src: str, dst: str, flags: int) -> None:
    if _SYS_RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, f"renameat2 is not wired for {platform.machine()}", src)
    res = _libc.syscall(
        ctypes.c_long(_SYS_RENAMEAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(src)),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(dst)),
        ctypes.c_uint(flags),
    )
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), src)


def rename_noreplace(dir_fd: int, src: str, dst: str) -> None:
    """Move `src` to `dst` within one directory; FileExistsError when `dst` exists."""
    _renameat2(dir_fd, src, dst, RENAME_NOREPLACE)


def exchange(dir_fd: int, a: str, b: str) -> None:
    """Swap the entries `a` and `b` of one directory atomically (both must exist)."""
    _renameat2(dir_fd, a, b, RENAME_EXCHANGE)
