"""Finding and killing every process a shell call started (SPEC §6: no grandchild survives).

A call's processes are found three ways, because each alone can be dodged:
- descendants of the call's shell (psutil, recursive) — lost once a parent exits;
- members of the call's session (the shell is started with `start_new_session`) — lost by
  a descendant that calls setsid();
- processes carrying the call's marker in their environment — lost only by one that also
  wipes its environment, and such an orphan is reparented to the agent (a child subreaper)
  and killed as an unknown orphan.
Killing repeats until nothing is left, so a process forked during a sweep is caught by the
next one.
"""

from __future__ import annotations

import os
import signal
import threading

import psutil

from sandbox_agent import syscalls

MARKER_ENV = "SANDBOX_AGENT_CALL"

_active_lock = threading.Lock()
_active_leaders: set[int] = set()  # shells of calls in flight: reaped by their own Popen
_adopting = False  # set once the agent became a child subreaper


def adopt_orphans() -> bool:
    """Make this process a child subreaper (the agent server does, at start). Only then are
    children it did not start adopted orphans, safe to kill; in any other process (a test
    runner) they may be anything."""
    global _adopting
    _adopting = syscalls.set_child_subreaper()
    return _adopting


def register_leader(pid: int) -> None:
    with _active_lock:
        _active_leaders.add(pid)


def unregister_leader(pid: int) -> None:
    with _active_lock:
        _active_leaders.discard(pid)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def call_processes(leader_pid: int, marker: str) -> dict[int, psutil.Process]:
    """Every live process that belongs to the call led by `leader_pid`."""
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    try:
        leader = psutil.Process(leader_pid)
        for proc in [leader, *leader.children(recursive=True)]:
            found[proc.pid] = proc
    except psutil.Error:
        pass
    my_uid = os.geteuid()
    needle = f"{MARKER_ENV}={marker}".encode()
    for proc in psutil.process_iter():
        pid = proc.pid
        if pid == me or pid in found:
            continue
        try:
            if os.getsid(pid) == leader_pid:
                found[pid] = proc
                continue
            if proc.uids().real != my_uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read():
                    found[pid] = proc
        except (OSError, psutil.Error):
            continue
    return {pid: proc for pid, proc in found.items() if _alive(proc)}


def orphans() -> list[psutil.Process]:
    """Children of the agent that no call in flight owns: adopted orphans (the agent is a
    child subreaper), alive or zombie."""
    with _active_lock:
        active = set(_active_leaders)
    try:
        return [p for p in psutil.Process().children() if p.pid not in active]
    except psutil.Error:
        return []


def _reap(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child (or already reaped)
        except OSError:
            pass


def kill_call(leader_pid: int, marker: str, *, rounds: int = 50) -> int:
    """SIGKILL everything of one call until nothing is left; returns how many were killed
    (the leader itself is not counted and not reaped: its Popen does that)."""
    killed: set[int] = set()
    for _ in range(rounds):
        victims = call_processes(leader_pid, marker)
        if _adopting:
            for proc in orphans():
                if _alive(proc):
                    victims[proc.pid] = proc
        if not victims:
            break
        try:
            os.killpg(leader_pid, signal.SIGKILL)
        except OSError:
            pass
        for pid, proc in victims.items():
            try:
                proc.kill()
            except psutil.Error:
                pass
            if pid != leader_pid:
                killed.add(pid)
        psutil.wait_procs([p for pid, p in victims.items() if pid != leader_pid], timeout=0.2)
        if _adopting:
            _reap({p.pid for p in orphans()})
    if _adopting:
        _reap({p.pid for p in orphans()})  # zombies adopted from earlier calls
    return len(killed)
