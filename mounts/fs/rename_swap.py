"""Atomic placement of a directory: `renameat2(2)` with RENAME_NOREPLACE or RENAME_EXCHANGE.

Replacing a non-empty directory with `rename(2)` is impossible, and "move the old one aside,
then move the new one in" leaves an instant in which the name is missing. RENAME_EXCHANGE
swaps two names in one step: a reader sees the old tree or the new one, never neither.
Python has no wrapper; the one ctypes call lives in `sandbox_agent.syscalls` (stdlib only,
imports nothing of ours), which the agent's own race tests use too.
"""

from __future__ import annotations

from sandbox_agent.syscalls import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2


def rename_noreplace(dir_fd: int, src: str, dst: str) -> None:
    """Move `src` to `dst` within one directory; FileExistsError when `dst` exists."""
    renameat2(dir_fd, src, dir_fd, dst, RENAME_NOREPLACE)


def exchange(dir_fd: int, a: str, b: str) -> None:
    """Swap the entries `a` and `b` of one directory atomically (both must exist)."""
    renameat2(dir_fd, a, dir_fd, b, RENAME_EXCHANGE)
