"""A cgroup of its own for each process-backend sandbox: what makes its lifetime and its share of
the host kernel facts (docs/processes.md, "Lifetime and limits").

- Stop is `cgroup.kill` (cgroup v2: the kernel kills every process in it, forks in flight
  included), then waiting for `cgroup.events` to say `populated 0`, then removing it. No scan of
  /proc can be outrun by a process that forks faster than the scan.
- Pause is `cgroup.freeze` (waiting for `frozen 1`); resume writes 0.
- CPU, memory and process limits (ORCH_SANDBOX_CPUS / _MEMORY_MB / _PIDS) go through the v2
  controllers where the v2 cgroup offers them, else through the v1 hierarchies (a hybrid host:
  v1 controllers, a v2 mount without them at /sys/fs/cgroup/unified).

Layout: `{v2 mount}/sandbox-orchestrator-{uid base}/user-{sandbox uid}`, and with v1 controllers
the same two levels below the orchestrator's own cgroup of each v1 hierarchy (v1 has no
"no processes in inner cgroups" rule, so sandboxes stay inside whatever bounds the orchestrator
itself is under). Names are made from validated integers only.

The agent joins its cgroups before it can fork: its launcher (`netns_exec.py`, as root) writes
its own pid into each `cgroup.procs` and only then switches to the sandbox uid and executes.

`plan_cgroup` decides which directories and files get which values (pure, tested without a
kernel); `SandboxCgroups` does it.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.log import kv

log = logging.getLogger(__name__)

V1_CONTROLLERS = ("pids", "memory", "cpu")  # the v1 hierarchies a sandbox joins for its limits
CPU_PERIOD_US = 100_000
KILL_WAIT_S = 5.0
FREEZE_WAIT_S = 5.0


class CgroupError(Exception):
    """A cgroup could not be made, joined, killed or frozen."""


@dataclass(frozen=True)
class SandboxLimits:
    cpus: float
    memory_bytes: int
    pids: int


@dataclass(frozen=True)
class CgroupMounts:
    """Where this host's cgroups are, as this process sees them."""

    v2: Path | None  # the cgroup2 mount (the whole tree on a pure-v2 host, `unified` on a hybrid one)
    v1: Mapping[str, Path]  # controller -> this process's own cgroup directory in that v1 hierarchy


@dataclass(frozen=True)
class CgroupPlan:
    """One sandbox's cgroups: what to create, write and join, in order."""

    v2_dir: Path  # kill, freeze and `populated` happen here
    create: tuple[Path, ...]  # directories, parents first
    writes: tuple[tuple[Path, str], ...]  # (file, value), after `create`
    procs: tuple[Path, ...]  # the `cgroup.procs` files the agent's launcher joins
    limited_by: str  # "v2", "v1" or "none": where the limits are enforced

    @property
    def remove(self) -> tuple[Path, ...]:
        """The sandbox's own directories, children first (the instance directories stay)."""
        return tuple(d for d in reversed(self.create) if d.name.startswith("user-"))


def _mountinfo_fields(line: str) -> tuple[str, str, str, str] | None:
    """(mount root, mount point, fs type, super options) of one /proc/self/mountinfo line."""
    left, sep, right = line.partition(" - ")
    if not sep:
        return None
    head, tail = left.split(), right.split()
    if len(head) < 5 or len(tail) < 3:
        return None
    unescape = lambda s: s.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")  # noqa: E731
    return unescape(head[3]), unescape(head[4]), tail[0], tail[2]


def parse_cgroup_mounts(mountinfo: str, proc_cgroup: str) -> CgroupMounts:
    """Pure: the v2 mount and this process's v1 cgroup directories from /proc/self/mountinfo
    and /proc/self/cgroup."""
    own: dict[str, str] = {}  # v1 controller -> own path in its hierarchy
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] != "0":
            for controller in parts[1].split(","):
                own[controller] = parts[2]
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields = _mountinfo_fields(line)
        if fields is None:
            continue
        root, point, fstype, options = fields
        if fstype == "cgroup2" and v2 is None:
            v2 = Path(point)
        elif fstype == "cgroup":
            for controller in options.split(","):
                if controller in V1_CONTROLLERS and controller not in v1 and controller in own:
                    path = own[controller]
                    # Below the mount's root (a cgroup namespace shows "/" for its own root).
                    relative = os.path.relpath(path, root) if path.startswith(root) else "."
                    v1[controller] = Path(os.path.normpath(os.path.join(point, relative)))
    return CgroupMounts(v2=v2, v1=v1)


def instance_name(uid_base: int) -> str:
    return f"sandbox-orchestrator-{int(uid_base)}"


def sandbox_name(sandbox_uid: int) -> str:
    return f"user-{int(sandbox_uid)}"


def plan_cgroup(
    mounts: CgroupMounts,
    *,
    uid_base: int,
    sandbox_uid: int,
    limits: SandboxLimits,
    v2_controllers: frozenset[str],
) -> CgroupPlan:
    """Pure: a sandbox's cgroups. `v2_controllers`: what the instance's v2 directory offers its
    children (its `cgroup.controllers`); with cpu, memory and pids all there, the limits are
    v2's, else v1's where those hierarchies are mounted."""
    if mounts.v2 is None:
        raise CgroupError("no cgroup2 filesystem is mounted")
    if isinstance(uid_base, bool) or isinstance(sandbox_uid, bool) or uid_base < 0 or sandbox_uid < 0:
        raise CgroupError("cgroup names are made from non-negative integers")
    parent, leaf = instance_name(uid_base), sandbox_name(sandbox_uid)
    v2_instance = mounts.v2 / parent
    v2_dir = v2_instance / leaf
    create: list[Path] = [v2_instance, v2_dir]
    writes: list[tuple[Path, str]] = []
    procs: list[Path] = [v2_dir / "cgroup.procs"]
    quota_us = max(1000, round(limits.cpus * CPU_PERIOD_US))
    if {"cpu", "memory", "pids"} <= v2_controllers:
        writes += [
            (v2_instance / "cgroup.subtree_control", "+cpu +memory +pids"),
            (v2_dir / "pids.max", str(limits.pids)),
            (v2_dir / "memory.max", str(limits.memory_bytes)),
            (v2_dir / "memory.swap.max", "0"),
            (v2_dir / "cpu.max", f"{quota_us} {CPU_PERIOD_US}"),
        ]
        limited_by = "v2"
    elif set(V1_CONTROLLERS) <= set(mounts.v1):
        v1 = {c: mounts.v1[c] / parent / leaf for c in V1_CONTROLLERS}
        for controller in V1_CONTROLLERS:
            create += [mounts.v1[controller] / parent, v1[controller]]
            procs.append(v1[controller] / "cgroup.procs")
        writes += [
            (v1["pids"] / "pids.max", str(limits.pids)),
            (v1["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes)),
            (v1["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US)),
            (v1["cpu"] / "cpu.cfs_quota_us", str(quota_us)),
        ]
        limited_by = "v1"
    else:
        limited_by = "none"
    return CgroupPlan(
        v2_dir=v2_dir, create=tuple(create), writes=tuple(writes), procs=tuple(procs), limited_by=limited_by
    )


def parse_events(text: str) -> dict[str, str]:
    """Pure: `cgroup.events` (`populated 1`, `frozen 0`) as a dict."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        out[key] = value.strip()
    return out


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _events(v2_dir: Path) -> dict[str, str]:
    try:
        return parse_events((v2_dir / "cgroup.events").read_text())
    except FileNotFoundError:
        return {"populated": "0", "frozen": "0"}


def _wait_for(v2_dir: Path, key: str, value: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while _events(v2_dir).get(key) != value:
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return True


def kill_cgroup(v2_dir: Path) -> bool:
    """Kill everything in the v2 cgroup `v2_dir` (frozen or not) and wait until it is empty;
    False when something was still in it after the wait. A missing cgroup is empty."""
    try:
        _write(v2_dir / "cgroup.kill", "1")
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.error("cgroup.kill failed %s", kv(cgroup=v2_dir, error=exc))
    empty = _wait_for(v2_dir, "populated", "0", KILL_WAIT_S)
    if not empty:
        log.error("a sandbox cgroup is still populated after cgroup.kill %s", kv(cgroup=v2_dir))
    return empty


class SandboxCgroups:
    """The shell: finds the host's cgroups once, then makes, kills, freezes and removes
    sandbox cgroups. `usable` is False (with a `reason`) when this process cannot manage
    cgroups (not root, no cgroup2 mount, a read-only one): the backend then works as before,
    and /healthz says process lifetime is not kernel-bounded."""

    def __init__(self, uid_base: int, limits: SandboxLimits, *, mounts: CgroupMounts | None = None) -> None:
        self.uid_base = uid_base
        self.limits = limits
        self.mounts = mounts if mounts is not None else self._read_mounts()
        self.usable, self.reason, self.limited_by = self._probe()

    @staticmethod
    def _read_mounts() -> CgroupMounts:
        try:
            return parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
        except OSError:
            return CgroupMounts(v2=None, v1={})

    def _probe(self) -> tuple[bool, str | None, str]:
        if os.geteuid() != 0:
            return False, "not root: sandbox cgroups cannot be made", "none"
        if self.mounts.v2 is None:
            return False, "no cgroup2 filesystem is mounted", "none"
        instance = self.mounts.v2 / instance_name(self.uid_base)
        try:
            instance.mkdir(mode=0o755, exist_ok=True)
            if not (instance / "cgroup.kill").exists():
                return False, f"{self.mounts.v2} has no cgroup.kill (Linux 5.14 or later needed)", "none"
        except OSError as exc:
            return False, f"cannot make a cgroup under {self.mounts.v2}: {exc.strerror}", "none"
        plan = self.plan(0)
        return True, None, plan.limited_by

    def _v2_controllers(self) -> frozenset[str]:
        assert self.mounts.v2 is not None
        try:
            return frozenset((self.mounts.v2 / instance_name(self.uid_base) / "cgroup.controllers").read_text().split())
        except OSError:
            return frozenset()

    def plan(self, sandbox_uid: int, limits: SandboxLimits | None = None) -> CgroupPlan:
        return plan_cgroup(
            self.mounts, uid_base=self.uid_base, sandbox_uid=sandbox_uid, limits=limits or self.limits,
            v2_controllers=self._v2_controllers(),
        )  # fmt: skip

    def prepare(self, sandbox_uid: int, limits: SandboxLimits | None = None) -> CgroupPlan:
        """A fresh, empty cgroup for the sandbox (one left by an earlier agent is emptied
        first), its limits written (`limits`: a user's own, else the default); the agent's
        launcher then joins `plan.procs`."""
        plan = self.plan(sandbox_uid, limits)
        if plan.v2_dir.exists():
            self.kill(plan)
        try:
            for directory in plan.create:
                directory.mkdir(mode=0o755, exist_ok=True)
            for path, value in plan.writes:
                _write(path, value)
        except OSError as exc:
            raise CgroupError(f"preparing {plan.v2_dir} failed: {exc}") from exc
        return plan

    def kill(self, plan: CgroupPlan, *, remove: bool = True) -> bool:
        """Kill everything in the sandbox's cgroup and wait until it is empty; then remove its
        directories. False when something was still in it after the wait."""
        empty = kill_cgroup(plan.v2_dir)
        if remove:
            self.remove(plan)
        return empty

    def remove(self, plan: CgroupPlan) -> None:
        for directory in plan.remove:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    log.warning("removing a sandbox cgroup failed %s", kv(cgroup=directory, error=exc))

    def kill_leftovers(self) -> int:
        """Kill and remove every sandbox cgroup of this instance (at start: nothing is adopted)."""
        killed = 0
        uids: set[int] = set()
        # v1 leaves too: a dead orchestrator's warden removed only the v2 ones.
        for instance in (d for d in self.plan(0).create if d.name == instance_name(self.uid_base)):
            try:
                uids |= {int(n[5:]) for n in os.listdir(instance) if n.startswith("user-") and n[5:].isdigit()}
            except OSError:
                continue
        for uid in sorted(uids):
            plan = self.plan(uid)
            if self.populated(plan):
                killed += 1
            self.kill(plan)
        if killed:
            log.warning("killed sandbox cgroups an earlier server left %s", kv(count=killed))
        return killed

    def close(self) -> None:
        """Remove this instance's own directories once its sandboxes' are gone (an rmdir of a
        cgroup that still has children fails, and leaves it)."""
        if not self.usable:
            return
        for directory in reversed(self.plan(0).create):
            if directory.name.startswith("sandbox-orchestrator-"):
                try:
                    directory.rmdir()
                except OSError:
                    pass

    def freeze(self, plan: CgroupPlan) -> bool:
        _write(plan.v2_dir / "cgroup.freeze", "1")
        return _wait_for(plan.v2_dir, "frozen", "1", FREEZE_WAIT_S)

    def thaw(self, plan: CgroupPlan) -> None:
        try:
            _write(plan.v2_dir / "cgroup.freeze", "0")
        except FileNotFoundError:
            pass

    def populated(self, plan: CgroupPlan) -> bool:
        return _events(plan.v2_dir).get("populated") == "1"

