"""One server per data dir: `orchestrator serve` holds an exclusive flock on
`state/serve.lock` for its lifetime (docs/operations.md, "One server per data dir").

Two servers on one data dir would each run their own sandboxes, sweepers and cleanups over the
same state and files. The lock file holds the holder's pid, so a refused second server can
name it. The kernel drops the lock with the holder's last fd, so a crashed server leaves
nothing to clean up. The state dir is the host's own (0700): no sandbox can reach the file,
and it is opened without following symlinks all the same.
"""

from __future__ import annotations

import errno
import fcntl
import os

from mounts.fs.nofollow import closing_fd, open_dirs, open_root
from mounts.layout import DataLayout
from orchestrator.startup_checks import StartupRefused

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_PID_BYTES = 32


class DataDirInUse(StartupRefused):
    code = "data_dir_in_use"


def in_use_message(data_dir: str, pid: int | None) -> str:
    """Pure: what a second server says."""
    holder = f"pid {pid}" if pid is not None else "a process whose pid it has not written yet"
    return (
        f"another orchestrator server ({holder}) already serves the data dir {data_dir}: stop it first, "
        "or give this one its own ORCH_DATA_DIR"
    )


def parse_pid(data: bytes) -> int | None:
    text = data.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() and 0 < int(text) < 2**31 else None


class DataDirLock:
    """The held lock; `release()` (or process exit) frees it."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def acquire(layout: DataLayout) -> DataDirLock:
    """Take the data dir's lock or raise `DataDirInUse` naming the holder's pid."""
    layout.root.mkdir(parents=True, exist_ok=True)
    relative = layout.serve_lock.relative_to(layout.root)
    with closing_fd(open_root(layout.root)) as root_fd:
        state_fd = open_dirs(root_fd, relative.parts[:-1], create=True)
    assert state_fd is not None  # created when missing
    with closing_fd(state_fd):
        fd = os.open(relative.name, _FLAGS, 0o600, dir_fd=state_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            raise
        pid = parse_pid(os.pread(fd, _MAX_PID_BYTES, 0))
        os.close(fd)
        raise DataDirInUse(in_use_message(str(layout.root), pid)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DataDirLock(fd)
