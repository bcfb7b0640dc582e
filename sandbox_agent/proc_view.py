"""Reading processes from /proc directly (not through psutil, which answers ZombieProcess for
a zombie leader whose other threads still run), and the tree their parent pids form. Shared by
the end-of-call sweep (process_tree.py) and the freeze of the sandbox's uid (uid_freeze.py)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

# PID 1 is the pid namespace's init (a container's, a pod's pause process): never the
# sandbox's to signal, and kill(-1) spares it.
INIT_PID = 1


def read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def stat_fields(path: str) -> list[bytes]:
    """The fields of a /proc stat file after the command name (which may hold spaces and parens)."""
    return read(path).rsplit(b")", 1)[1].split()


def start_of(pid: int) -> int:
    """Clock ticks since boot when `pid` started: tells it from a later process reusing the pid."""
    return int(stat_fields(f"/proc/{pid}/stat")[19])


def status_field(status: bytes, name: bytes) -> bytes | None:
    """The first value of a line `name:` of /proc/PID/status."""
    for line in status.splitlines():
        if line.startswith(name + b":"):
            return line.split()[1]
    return None


def real_uid(status: bytes) -> int:
    """From /proc/PID/status: the real uid (a setuid program keeps it too)."""
    value = status_field(status, b"Uid")
    return int(value) if value is not None else -1


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants_of(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """Every pid below `roots` in the tree that `parents` (pid -> parent pid) describes."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def depth_in(pid: int, parents: Mapping[int, int]) -> int:
    """How many ancestors of `pid` `parents` (pid -> parent pid) knows."""
    seen: set[int] = set()
    while pid in parents and pid not in seen:
        seen.add(pid)
        pid = parents[pid]
    return len(seen)
