"""Freezing every process of the sandbox's uid, atomically with respect to fork, for the
end-of-call sweep (process_tree.py): a fork-hopper (each generation forks its successor and
exits at once) outruns any scan of /proc, but nothing stopped can fork.

`kill(-1, SIGSTOP)` reaches every process the caller may signal but the caller itself (all its
threads) and the PID namespace's init, and the kernel applies it atomically with respect to
fork: it walks the task list under the lock fork takes to add a child, and a fork under way
when the signal is sent fails and is restarted (stopped). Only where the uid is the sandbox's
alone and not root: anywhere else kill(-1) reaches processes that are not the sandbox's.

Afterwards the survivors are continued (SIGCONT), but not those that were stopped before the
freeze or had a SIGSTOP pending (a job the user suspended stays suspended). Background
processes' trees are stopped a generation at a time, parents first, and everything is
continued children first: a shell with job control (`bash -i` on a PTY) that sees its
foreground job stop reports it as Stopped and takes the terminal back, so it must be stopped
before the job and continued after it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from sandbox_agent.proc_view import INIT_PID, depth_in, descendants_of, pids, read, real_uid, start_of, stat_fields, status_field

STOP_WAIT_S = 0.05  # how long one generation of a kept tree is given to reach its stop
_SIGSTOP_BIT = 1 << (signal.SIGSTOP - 1)


@dataclass(frozen=True)
class Census:
    """What the freeze found before it stopped anything: the pids of every uid it saw, ours
    (pid -> parent pid) and ours that were stopped already (pid -> start)."""

    seen: frozenset[int]
    mine: Mapping[int, int]
    stopped: Mapping[int, int]


@contextmanager
def frozen(*, kept: Iterable[int] = ()) -> Iterator[None]:
    """Every process of this uid but the caller and the namespace's init stopped for the
    duration. `kept`: the leaders of the background processes, whose trees are stopped parent
    first. The caller must start no process meanwhile (its child could stop between fork and
    exec while the caller waits for it)."""
    before = census(os.getuid())
    stop_parents_first(before, kept)
    try:
        os.kill(-1, signal.SIGSTOP)
    except ProcessLookupError:
        pass  # nothing of the uid but the caller
    try:
        yield
    finally:
        continue_after(before)


def stopping(status: bytes) -> bool:
    """From /proc/PID/status: stopped by a signal (state T), or about to be (a SIGSTOP still
    pending: `kill -STOP` returns before the target has stopped)."""
    if status_field(status, b"State") == b"T":
        return True
    return any(int(status_field(status, name) or b"0", 16) & _SIGSTOP_BIT for name in (b"SigPnd", b"ShdPnd"))


def census(my_uid: int) -> Census:
    """One status read per process (no full scan)."""
    seen, mine, stopped = set(), {}, {}
    for pid in pids():
        try:
            status = read(f"/proc/{pid}/status")
            seen.add(pid)
            if real_uid(status) == my_uid:
                mine[pid] = int(status_field(status, b"PPid") or 0)
                if stopping(status):
                    stopped[pid] = start_of(pid)
        except (OSError, ValueError, IndexError):
            continue
    return Census(frozenset(seen), mine, stopped)


def deepest_first(candidates: Iterable[int], parents: Mapping[int, int]) -> list[int]:
    """`candidates` ordered children before their parents (by depth in `parents`; a pid it
    does not know, forked after it was taken, first)."""
    return sorted(candidates, key=lambda pid: -depth_in(pid, parents) if pid in parents else -len(parents) - 1)


def stop_parents_first(before: Census, kept: Iterable[int]) -> None:
    """Stop the kept trees a generation at a time, every parent stopped before its children
    are told. What is not stopped here, kill(-1) stops after."""
    tree = descendants_of(before.mine, kept) | (set(kept) & before.mine.keys())
    levels: dict[int, list[int]] = {}
    for pid in tree - before.stopped.keys():
        levels.setdefault(depth_in(pid, before.mine), []).append(pid)
    for level in sorted(levels):
        pending = []
        for pid in levels[level]:
            try:
                os.kill(pid, signal.SIGSTOP)
                pending.append(pid)
            except OSError:
                continue
        deadline = time.monotonic() + STOP_WAIT_S
        while pending and time.monotonic() < deadline:
            pending = [pid for pid in pending if not _halted(pid)]
            if pending:
                time.sleep(0.0005)


def _halted(pid: int) -> bool:
    try:
        return stat_fields(f"/proc/{pid}/stat")[0] in (b"T", b"Z", b"X")
    except (OSError, IndexError):
        return True


def continue_after(before: Census) -> None:
    """SIGCONT every process of the uid but the caller, the namespace's init and those stopped
    before; also those not seen stopped yet (asleep in the kernel with the stop pending):
    SIGCONT cancels a pending stop. Children before their parents. Of the pids the census saw,
    only ours are told, so a process of another uid in the caller's session (which SIGCONT
    could reach) is not; a pid new since is read again (it was forked just before the freeze).
    A plain kill(): nothing of the uid can fork while it is frozen and the caller starts nothing."""
    me, my_uid = os.getpid(), os.getuid()
    for pid in deepest_first(pids(), before.mine):
        if pid in (me, INIT_PID):
            continue
        try:
            if pid in before.stopped and start_of(pid) == before.stopped[pid]:
                continue  # stopped before the freeze (a suspended job): stays so
            if pid in before.seen and pid not in before.mine:
                continue
            if pid not in before.seen and real_uid(read(f"/proc/{pid}/status")) != my_uid:
                continue
            os.kill(pid, signal.SIGCONT)
        except (OSError, ValueError, IndexError):
            continue
