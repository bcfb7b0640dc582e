"""Reaping the orphans the agent adopts, as they die (it is the sandbox's child subreaper).

Every process whose parent exits becomes the agent's child; when it exits it stays a zombie
until the agent reaps it, and a zombie still counts against the sandbox's process limit. A
fork-hopper (each generation forks its successor and exits) leaves one per generation: reaped
only at the end of a call, 500 of them filled the limit within the call and every fork after
failed. So a thread waits for any child to exit (`waitid(P_ALL, WNOWAIT)`, which looks
without reaping) and reaps it at once, unless a Popen owns it (a call's shell, a background
process): that one reaps its own, or it would lose the exit status. While such an owned
zombie waits for its Popen (it comes first in the kernel's answer), the orphans behind it are
found in the agent's list of children.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from sandbox_agent import process_tree

log = logging.getLogger("sandbox_agent")

NO_CHILD_WAIT_S = 5.0  # with no child at all, a spawn wakes the thread; this is only a safety net
OWNED_WAIT_S = 0.005  # an owned zombie is reaped by its Popen within moments


def child_pids() -> list[int]:
    """The agent's children, from /proc (each thread's list: an adopted orphan may hang on any)."""
    me = os.getpid()
    pids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{me}/task")
    except OSError:
        return pids
    for tid in tids:
        try:
            with open(f"/proc/{me}/task/{tid}/children", "rb") as fh:
                pids.extend(int(pid) for pid in fh.read().split())
        except (OSError, ValueError):
            continue
    return pids


def zombie_children() -> list[int]:
    return [pid for pid in child_pids() if process_tree.is_zombie(pid)]


def reap_as_they_die() -> None:
    while True:
        process_tree.spawned.clear()  # before looking: a spawn after this wakes the wait below
        try:
            exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            process_tree.spawned.wait(NO_CHILD_WAIT_S)
            continue
        if exited is not None and process_tree.reap_unowned([exited.si_pid]):
            continue
        process_tree.reap_unowned(zombie_children())
        time.sleep(OWNED_WAIT_S)


def start() -> None:
    def run() -> None:
        try:
            reap_as_they_die()
        except Exception:
            log.exception("the orphan reaper stopped")

    threading.Thread(target=run, name="orphan-reaper", daemon=True).start()
