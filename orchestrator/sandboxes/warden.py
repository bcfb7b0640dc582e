"""The thaw warden: what bounds a paused sandbox whose orchestrator vanished, and what ends the
process backend's sandbox cgroups then.

Each agent stops itself after the idle timeout (its dead-man switch), but a frozen agent
runs no timer: a container paused by an orchestrator that was then killed and never came
back would stay frozen, holding its memory, forever. The warden is a small process outside
every freezer, started (in a session of its own) with the first pause or sandbox cgroup. The orchestrator
tells it over a pipe what it froze and thawed; the pipe's end, however the orchestrator
ends (SIGKILL included: the kernel closes the pipe), makes the warden thaw whatever is
still frozen: the paused containers of this instance (by label) and the SIGSTOPped process
agents it was told about (pid and start time, so a reused pid is left alone). Thawed, each
agent's own switch stops it once it has been idle for its timeout. A restarted orchestrator
thaws the paused containers of its instance at adoption as well (docs/lifecycle.md).

Process-backend sandboxes in cgroups of their own (orchestrator/sandboxes/cgroups.py) are not
adopted by a next server: they end with this one. The warden is told each sandbox cgroup as it
is made and kills (`cgroup.kill`, frozen or not) and removes those still there when the pipe
ends, so a sandbox whose agent cannot act any more (frozen, or a process that outran it) does
not outlive its orchestrator.

Wire: one line per event, `frozen PID START` / `thawed PID` (SIGSTOPped process agents),
`cgroup PATH` / `uncgroup PATH` (sandbox cgroups); docker containers need no line (the label
finds them).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from orchestrator.log import kv

log = logging.getLogger(__name__)


class Warden:
    """The orchestrator's side: starts the warden process once and reports to it."""

    def __init__(self, instance: str | None) -> None:
        self._instance = instance
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def _ensure(self) -> subprocess.Popen[bytes] | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        command = [sys.executable, "-m", "orchestrator.sandboxes.warden"]
        if self._instance is not None:
            command += ["--instance", self._instance]
        try:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=None,
                start_new_session=True,  # not in our process group: a signal to us does not reach it
            )  # fmt: skip
        except OSError as exc:
            log.error("the thaw warden did not start %s", kv(error=exc))
            self._proc = None
        return self._proc

    def _say(self, line: str) -> None:
        with self._lock:
            proc = self._ensure()
            if proc is None or proc.stdin is None:
                return
            try:
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()
            except OSError as exc:
                log.warning("the thaw warden is gone %s", kv(error=exc))

    def started(self) -> None:
        """Before the first pause: the warden runs from now on."""
        self._say("hello")

    def frozen(self, pid: int, start_time: float) -> None:
        self._say(f"frozen {pid} {start_time!r}")

    def thawed(self, pid: int) -> None:
        self._say(f"thawed {pid}")

    def watch_cgroup(self, path: Path) -> None:
        self._say(f"cgroup {path}")

    def forget_cgroup(self, path: Path) -> None:
        self._say(f"uncgroup {path}")

    def close(self) -> None:
        """At shutdown: the warden thaws what is left and exits (as it would if we died)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


# --- the warden process ------------------------------------------------------------------------


def sandbox_cgroup_path(text: str) -> Path | None:
    """A sandbox cgroup's path (`.../sandbox-orchestrator-N/user-M`, absolute), else None."""
    path = Path(text)
    leaf, parent = path.name, path.parent.name
    if (
        path.is_absolute() and ".." not in path.parts
        and leaf.startswith("user-") and leaf[5:].isdigit()
        and parent.startswith("sandbox-orchestrator-") and parent[21:].isdigit()
    ):  # fmt: skip
        return path
    return None


def parse_line(line: str, frozen: dict[int, float], cgroups: set[Path] | None = None) -> None:
    """Pure on `frozen` and `cgroups`: apply one line of the wire; anything else is ignored."""
    parts = line.split()
    try:
        if len(parts) == 3 and parts[0] == "frozen":
            frozen[int(parts[1])] = float(parts[2])
        elif len(parts) == 2 and parts[0] == "thawed":
            frozen.pop(int(parts[1]), None)
        elif len(parts) == 2 and parts[0] in ("cgroup", "uncgroup") and cgroups is not None:
            path = sandbox_cgroup_path(parts[1])
            if path is not None and parts[0] == "cgroup":
                cgroups.add(path)
            elif path is not None:
                cgroups.discard(path)
    except ValueError:
        pass


def kill_cgroups(cgroups: set[Path]) -> int:
    from orchestrator.sandboxes.cgroups import kill_cgroup

    killed = 0
    for path in cgroups:
        if not path.is_dir():
            continue
        kill_cgroup(path)
        try:
            path.rmdir()
        except OSError:
            pass
        killed += 1
    return killed


def thaw_processes(frozen: dict[int, float]) -> int:
    import psutil

    thawed = 0
    for pid, start in frozen.items():
        try:
            root = psutil.Process(pid)
            if root.create_time() != start:
                continue  # not the agent we were told about
            for proc in [root, *root.children(recursive=True)]:
                proc.send_signal(signal.SIGCONT)
            thawed += 1
        except psutil.Error:
            continue
    return thawed


def thaw_containers(instance: str) -> int:
    import docker
    from docker.errors import DockerException

    from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, LABEL_MANAGED, MANAGED_VALUE

    thawed = 0
    try:
        engine = docker.from_env(timeout=30)
    except DockerException:
        return 0
    try:
        filters = {"label": [f"{LABEL_MANAGED}={MANAGED_VALUE}", f"{LABEL_INSTANCE}={instance}"], "status": "paused"}
        for container in engine.containers.list(all=True, filters=filters):
            try:
                container.unpause()
                thawed += 1
            except DockerException:
                continue
    finally:
        engine.close()
    return thawed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="thaw what an orchestrator froze once it is gone")
    parser.add_argument("--instance", default=None, help="the docker instance label of the orchestrator")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the orchestrator
    frozen: dict[int, float] = {}
    cgroups: set[Path] = set()
    for raw in sys.stdin.buffer:
        parse_line(raw[:4096].decode("utf-8", "replace"), frozen, cgroups)
    sandboxes = kill_cgroups(cgroups)
    processes = thaw_processes(frozen)
    containers = thaw_containers(args.instance) if args.instance else 0
    print(
        f"thaw warden: the orchestrator is gone {kv(pid=os.getpid(), processes=processes, containers=containers, cgroups_killed=sandboxes)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
