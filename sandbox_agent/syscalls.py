"""Linux system calls Python has no wrapper for, called through ctypes.

`openat2(2)` (syscall 437, Linux 5.6) resolves and opens in one step under kernel-enforced
rules; `renameat2(2)` with RENAME_EXCHANGE is used by the race tests and the benchmark;
`prctl(PR_SET_CHILD_SUBREAPER)` lets the agent adopt orphaned grandchildren so a shell's
double-forked processes can still be found and killed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

SYS_OPENAT2 = 437  # same number on every architecture (added after the syscall table unification)
SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(platform.machine())

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_OPEN_HOW_SIZE = ctypes.sizeof(_OpenHow)

# A dedicated prototype keeps the per-call cost near 1 µs (no argument sniffing).
_openat2_proto = ctypes.CFUNCTYPE(
    ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_OpenHow), ctypes.c_size_t,
    use_errno=True,
)
_openat2_call = _openat2_proto(("syscall", _libc))


_hows: dict[tuple[int, int, int], _OpenHow] = {}


def openat2_raw(dir_fd: int, path: bytes, flags: int, resolve: int, mode: int = 0) -> int:
    """The new fd, or a negative errno (no exception: callers branch on the errno)."""
    key = (flags, mode, resolve)
    how = _hows.get(key)
    if how is None:  # the kernel only reads the struct, so one per combination is shared
        how = _hows.setdefault(key, _OpenHow(flags, mode, resolve))
    fd = _openat2_call(SYS_OPENAT2, dir_fd, path, how, _OPEN_HOW_SIZE)
    if fd < 0:
        return -ctypes.get_errno()
    return fd


def openat2(dir_fd: int, path: str | bytes, flags: int, resolve: int, mode: int = 0) -> int:
    raw = os.fsencode(path)
    fd = openat2_raw(dir_fd, raw, flags, resolve, mode)
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), os.fsdecode(raw))
    return fd


def _probe_openat2() -> bool:
    fd = openat2_raw(-100, b"/", os.O_PATH | os.O_CLOEXEC, RESOLVE_NO_MAGICLINKS)  # AT_FDCWD
    if fd >= 0:
        os.close(fd)
        return True
    return False


OPENAT2_AVAILABLE = _probe_openat2()


def renameat2(src_dir_fd: int, src: str, dst_dir_fd: int, dst: str, flags: int) -> None:
    if SYS_RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not wired for this architecture")
    res = _syscall(
        ctypes.c_long(SYS_RENAMEAT2),
        ctypes.c_int(src_dir_fd),
        ctypes.c_char_p(os.fsencode(src)),
        ctypes.c_int(dst_dir_fd),
        ctypes.c_char_p(os.fsencode(dst)),
        ctypes.c_uint(flags),
    )
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), src)


def set_child_subreaper() -> bool:
    res = _libc.prctl(ctypes.c_int(PR_SET_CHILD_SUBREAPER), ctypes.c_ulong(1), 0, 0, 0)
    return res == 0
