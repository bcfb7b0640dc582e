"""The end-of-call sweep (sandbox_agent/process_tree.py), side by side in one run: the /proc
scan rounds alone (as where the uid is shared) and with the uid frozen first (kill(-1,
SIGSTOP), as where the uid is the sandbox's alone).

A forked worker takes a spare uid of ORCH_SANDBOX_UID_BASE's block (root needed) and becomes
a child subreaper with the orphan reaper, as the agent does. Then, for each mode:
1. the sweep's cost: a call that leaves 3 processes behind, with 10 kept background
   processes running (which the sweep spares), timed over `--rounds` calls (median, p99);
2. a fork-hopper (every generation forks its successor and exits): started by a call, then
   the sweep; how many of `--hoppers` tries left it still running 0.5 s later.
Also the number of tasks on the host (kill(-1) walks them all where the sandbox has no PID
namespace of its own, as on the process backend).

Run: sudo .venv/bin/python bench/call_sweep.py [--rounds 30] [--hoppers 5]
(prints `name: value unit` lines)
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import pct  # noqa: E402
from sandbox_agent import orphan_reaper, process_tree  # noqa: E402

HOPPER = "import os\nwhile True:\n    try:\n        if os.fork(): os._exit(0)\n    except OSError:\n        pass\n"
KEPT = 10


def _spawn(command: list[str], *, kept: bool = False) -> tuple[subprocess.Popen[bytes], process_tree.Leader]:
    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)

    return process_tree.spawn(start, os.urandom(12).hex(), kept=kept)


def _call(command: list[str]) -> float:
    """One call: run it to its end, then the sweep; returns the sweep's seconds."""
    proc, leader = _spawn(command)
    proc.wait()
    started = time.perf_counter()
    process_tree.kill_call(leader)
    took = time.perf_counter() - started
    process_tree.unregister(leader)
    return took


def _strays(spared: set[int]) -> int:
    me, uid = os.getpid(), os.getuid()
    return sum(
        1
        for info in process_tree.scan().values()
        if info.uid == uid and info.running and info.pid != me and info.pid not in spared
    )


def measure(mode: str, rounds: int, hoppers: int, kept: set[int]) -> None:
    frozen = mode == "frozen"
    process_tree.freezes = lambda: frozen  # type: ignore[assignment]
    spared = set(kept)
    costs = [_call(["/bin/sh", "-c", "sleep 100 & sleep 100 & setsid sleep 100 & exit 0"]) for _ in range(rounds)]
    print(f"sweep_{mode}_median: {statistics.median(costs) * 1000:.2f} ms")
    print(f"sweep_{mode}_p99: {pct(costs, 0.99) * 1000:.2f} ms")
    survived = 0
    for _ in range(hoppers):
        _call(["/bin/sh", "-c", f"env -i setsid /usr/bin/python3 -c '{HOPPER}' & sleep 0.2"])
        time.sleep(0.5)
        if _strays(spared):
            survived += 1
            _kill_uid_but_kept(kept)
    print(f"hopper_survived_{mode}: {survived}/{hoppers} calls")


def _kill_uid_but_kept(kept: set[int]) -> None:
    """Clean a surviving hopper up the one sure way: the frozen sweep of a call that is over."""
    process_tree.freezes = lambda: True  # type: ignore[assignment]
    _call(["/bin/true"])
    process_tree.freezes = lambda: False  # type: ignore[assignment]


def worker(rounds: int, hoppers: int) -> None:
    resource.setrlimit(resource.RLIMIT_NPROC, (512, 512))  # the agent's default (ORCH_SANDBOX_PIDS)
    if process_tree.adopt_orphans():
        orphan_reaper.start()  # as the agent: adopted orphans reaped as they die
    process_tree.sweep_uid(True)
    sleepers = [_spawn(["sleep", "1000"], kept=True) for _ in range(KEPT)]
    kept = {proc.pid for proc, _ in sleepers}
    try:
        for mode in ("scan_only", "frozen"):
            measure(mode, rounds, hoppers, kept)
    finally:
        os.kill(-1, signal.SIGKILL)  # everything of this spare uid but this worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--hoppers", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("call_sweep: needs root (the worker runs as a spare sandbox uid of its own)")
    base = int(os.environ.get("ORCH_SANDBOX_UID_BASE", "900000000"))
    uid = base + int(os.environ.get("ORCH_MAX_USER_ID", "1000000000")) - 1  # the block's last uid
    print(f"host_tasks: {sum(len(os.listdir(f'/proc/{p}/task')) for p in os.listdir('/proc') if p.isdigit())} tasks")
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() == (uid, uid, uid):  # never a kill(-1) as root
                worker(args.rounds, args.hoppers)
                code = 0
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
