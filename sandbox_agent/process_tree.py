"""Finding and killing every process a shell call started: nothing a call started outlives it.

A call's own processes are found three ways, because each alone can be dodged:
- descendants of the call's shell — lost once a parent exits;
- members of the call's session (the shell is started with `start_new_session`) — lost by
  a descendant that calls setsid();
- processes carrying the call's marker in their environment — lost by one that also wipes
  its environment.
What dodges all three is caught by the leftover sweep: every process of the sandbox's uid
(when the uid is the sandbox's alone; otherwise the agent's own children, adopted orphans as
the agent is a child subreaper) that is not the agent, one of its ancestors (bwrap, the
container's init) or a kept long-lived process. While other calls are in flight the sweep
spares whatever started after the oldest of them (it may be theirs); the sweep after the
last call ends takes everything.

Processes are read from /proc directly, not through psutil: psutil answers ZombieProcess for
a zombie leader whose other threads still run (`pthread_exit` of the main thread), which is
how such a process used to count as dead and keep running. Here a process runs while any of
its threads is not a zombie, and zombies are signalled like everything else.

Killing repeats until nothing is left, so a process forked during a sweep is caught by the
next round. A fork-hopper (every generation forks its successor and exits at once) forks
faster than any round, so where the uid is the sandbox's alone (and not root) the sweep first
freezes the whole uid (uid_freeze.py: kill(-1, SIGSTOP), which the kernel applies atomically
with respect to fork); nothing stopped can fork, so one calm round finds everything, and the
survivors are continued after. Where the uid is shared (the process backend without root)
nothing freezes it: kill(-1) would reach the orchestrator's own processes, and a hopper can
outrun the rounds there.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from subprocess import Popen
from typing import Any

from sandbox_agent import syscalls, uid_freeze
from sandbox_agent.proc_view import INIT_PID, descendants_of, read, real_uid, start_of, stat_fields

MARKER_ENV = "SANDBOX_AGENT_CALL"

# Spawning + registering a leader, reaping and a sweep's freeze of the uid are atomic w.r.t.
# each other; re-entrant, as a sweep under a freeze reads the registrations too.
_lock = threading.RLock()
spawned = threading.Event()  # set at every spawn: there may be children (and orphans) to reap
_active: set[Leader] = set()  # shells of calls in flight: reaped by their own Popen
# Background processes the agent owns (sandbox_agent/processes.py): they and their
# descendants are never swept; their leaders are reaped by their own Popen, never here.
_kept: set[int] = set()
_owned: set[int] = set()
_adopting = False  # set once the agent became a child subreaper
_sweep_uid = False  # every process of this uid belongs to this sandbox (a uid of its own)


@dataclass(frozen=True)
class Leader:
    """A call's shell: its pid, its start time (clock ticks since boot, which tells it from a
    later process that reuses the pid) and the marker in its environment."""

    pid: int
    start: int
    marker: str


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    sid: int
    start: int
    uid: int
    running: bool  # some thread is not a zombie


def adopt_orphans() -> bool:
    """Make this process a child subreaper (the agent server does, at start). Only then are
    children it did not start adopted orphans, safe to kill; in any other process (a test
    runner) they may be anything."""
    global _adopting
    _adopting = syscalls.set_child_subreaper()
    return _adopting


def sweep_uid(enabled: bool) -> None:
    """Whether the leftover sweep takes every process of this uid (the agent runs as a uid no
    one else uses: a sandbox uid) or only the agent's own children."""
    global _sweep_uid
    _sweep_uid = enabled


def keep(pid: int) -> None:
    with _lock:
        _kept.add(pid)


def release(pid: int) -> None:
    with _lock:
        _kept.discard(pid)


# --- reading /proc ----------------------------------------------------------------------------


def _running(pid: int, state: bytes) -> bool:
    if state != b"Z":
        return True
    try:  # a zombie leader: does another thread of its group still run?
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            if stat_fields(f"/proc/{pid}/task/{tid}/stat")[0] != b"Z":
                return True
        except (OSError, IndexError):
            continue
    return False


def _info(pid: int) -> ProcInfo | None:
    try:
        fields = stat_fields(f"/proc/{pid}/stat")
        uid = real_uid(read(f"/proc/{pid}/status"))
        # state(3) ppid(4) pgrp(5) session(6) ... starttime(22), numbered as in proc(5)
        return ProcInfo(pid, int(fields[1]), int(fields[3]), int(fields[19]), uid, _running(pid, fields[0]))
    except (OSError, ValueError, IndexError):
        return None  # gone meanwhile


def scan() -> dict[int, ProcInfo]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _info(int(name))
            if info is not None:
                table[info.pid] = info
    return table


def is_zombie(pid: int) -> bool:
    """Exited and waiting to be reaped (every thread a zombie)."""
    try:
        return not _running(pid, stat_fields(f"/proc/{pid}/stat")[0])
    except (OSError, IndexError):
        return False


def _has_marker(pid: int, needle: bytes) -> bool:
    try:
        return needle in read(f"/proc/{pid}/environ")
    except OSError:
        return False


# --- deciding ---------------------------------------------------------------------------------


def _descendants(table: Mapping[int, ProcInfo], roots: Iterable[int]) -> set[int]:
    return descendants_of({info.pid: info.ppid for info in table.values()}, roots)


def _ancestors(table: Mapping[int, ProcInfo], pid: int) -> set[int]:
    found: set[int] = set()
    info = table.get(pid)
    while info is not None and info.ppid not in found and info.ppid > 0:
        found.add(info.ppid)
        info = table.get(info.ppid)
    return found


def select_victims(
    table: Mapping[int, ProcInfo],
    leader: Leader,
    *,
    me: int,
    my_uid: int,
    others: Iterable[Leader],
    kept: Iterable[int],
    whole_uid: bool,
    has_marker: Callable[[int], bool],
) -> set[int]:
    """The running processes to kill after (or to cancel) the call led by `leader`. Pure but
    for `has_marker` (a read of a process's environment)."""
    # PID 1 is the pid namespace's init (a Kubernetes pod's pause process may run as our uid,
    # outside our ancestry): never ours, and a SIGKILL from inside the namespace is ignored.
    protected = {INIT_PID, me, *_ancestors(table, me), *kept, *_descendants(table, kept)}
    own: set[int] = set()
    head = table.get(leader.pid)
    if head is not None and head.start == leader.start:  # still the call's shell, not a reused pid
        own = {leader.pid, *_descendants(table, [leader.pid])}
    # While other calls run, only what is older than all of them can be nobody's but ours.
    cutoff = min((other.start for other in others), default=None)
    victims = set()
    for info in table.values():
        # Only our uid: the agent cannot signal any other, and a setuid program keeps it as its real uid.
        if not info.running or info.pid in protected or info.uid != my_uid:
            continue
        if info.pid in own or info.sid == leader.pid:
            victims.add(info.pid)
            continue
        if info.ppid == 0:
            # Its parent is outside our pid namespace: the runtime entered it (a pod's exec
            # probe, `kubectl exec`, `docker exec`). Nothing inside can make such a process, and
            # killing a probe that ran during a call failed the pod's readiness. What it forks
            # has a parent inside and is judged like anything else.
            continue
        leftover = whole_uid or info.ppid == me
        if leftover and (cutoff is None or info.start < cutoff):
            victims.add(info.pid)
        elif has_marker(info.pid):
            victims.add(info.pid)
    return victims


# --- acting -----------------------------------------------------------------------------------


def spawn(start: Callable[[], Popen[Any]], marker: str, *, kept: bool = False) -> tuple[Popen[Any], Leader]:
    """Start a call's shell with `start()` and register it, atomically with respect to the
    leftover sweep and the reaping of orphans (neither may take it for a leftover). `kept`:
    a background process instead (sandbox_agent/processes.py), never swept and reaped only
    by its own Popen, until `disown`."""
    with _lock:
        proc = start()
        try:
            leader = Leader(proc.pid, start_of(proc.pid), marker)
        except (OSError, ValueError, IndexError):
            leader = Leader(proc.pid, -1, marker)
        if kept:
            _kept.add(proc.pid)
            _owned.add(proc.pid)
        else:
            _active.add(leader)
    spawned.set()
    return proc, leader


def disown(leader: Leader) -> None:
    """After its Popen reaped it: the pid may be anyone's from now on."""
    with _lock:
        _kept.discard(leader.pid)
        _owned.discard(leader.pid)


def kill_kept(leader: Leader) -> int:
    """Kill a background process's whole tree: no longer kept, so the sweep takes it too."""
    with _lock:
        _kept.discard(leader.pid)
    return kill_call(leader)


def unregister(leader: Leader) -> None:
    with _lock:
        _active.discard(leader)


def _signal(pid: int, start: int) -> None:
    """SIGKILL `pid` if it is still the process that started at `start` (a pidfd pins it)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            return  # gone already
        try:  # a kernel before 5.3
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        return
    try:
        if start_of(pid) == start:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
    finally:
        os.close(fd)


def reap_unowned(zombies: Iterable[int]) -> int:
    """Reap those of the agent's zombie children `zombies` that no Popen owns (adopted
    orphans): a call's shell and a background process are reaped by their own Popen, which
    would otherwise lose its exit status. Returns how many were reaped."""
    if not _adopting:
        return 0
    reaped = 0
    with _lock:  # a shell spawned meanwhile is registered before its pid can be seen here
        leaders = {leader.pid for leader in _active} | _owned
        for pid in zombies:
            if pid in leaders:
                continue
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped += 1
            except OSError:
                pass  # not our child after all (or already reaped)
    return reaped


def _reap_orphans(table: Mapping[int, ProcInfo]) -> None:
    me = os.getpid()
    reap_unowned(info.pid for info in table.values() if info.ppid == me and not info.running)


def freezes() -> bool:
    """Whether the sweep freezes the uid first: only a uid of the sandbox's own (kill(-1)
    reaches every process of it), and never root (it would reach every process there is)."""
    return _sweep_uid and os.getuid() != 0


def kill_call(leader: Leader, *, rounds: int = 50) -> int:
    """SIGKILL everything of one call, and the leftovers of earlier ones, until nothing is
    left; returns how many were killed (the leader itself is not counted and not reaped: its
    Popen does that). With the uid frozen first where it is the sandbox's alone."""
    if freezes():
        # Under the lock throughout: no spawn runs while the uid is frozen (nor is left between
        # fork and exec, its child stopped while its thread holds the lock).
        with _lock, uid_freeze.frozen(kept=set(_kept)):
            return _kill_rounds(leader, rounds)
    return _kill_rounds(leader, rounds)


def _kill_rounds(leader: Leader, rounds: int) -> int:
    me, my_uid = os.getpid(), os.getuid()
    needle = f"{MARKER_ENV}={leader.marker}".encode()
    killed: set[int] = set()
    for _ in range(rounds):
        # Scan first, then look at the calls in flight: a call that starts in between is
        # registered (spawn does it atomically with the fork) before this snapshot, so it is
        # among `others` and its processes are spared. The other order took a call starting
        # in that window for a leftover of this one and killed it.
        table = scan()
        with _lock:
            others = [other for other in _active if other != leader]
            kept = set(_kept)
        _reap_orphans(table)  # zombies adopted from this call's kills and from earlier calls
        victims = select_victims(
            table,
            leader,
            me=me,
            my_uid=my_uid,
            others=others,
            kept=kept,
            whole_uid=_sweep_uid,
            has_marker=lambda pid: _has_marker(pid, needle),
        )
        if not victims:
            break
        head = table.get(leader.pid)
        if head is not None and head.start == leader.start:
            # Unreaped, so its pid (and process group id) cannot be anyone else's yet: the
            # whole group at once, forks racing this round included.
            try:
                os.killpg(leader.pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in victims:
            _signal(pid, table[pid].start)
        killed |= victims - {leader.pid}
        _wait_gone(victims)
    return len(killed)


def _wait_gone(pids: set[int], timeout_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                state = stat_fields(f"/proc/{pid}/stat")[0]
            except (OSError, IndexError):
                pending.discard(pid)
                continue
            if not _running(pid, state):
                pending.discard(pid)
        if pending:
            time.sleep(0.005)
