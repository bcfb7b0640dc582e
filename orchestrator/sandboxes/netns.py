"""The process backend's network isolation (docs/sandbox-agent.md, "Network").

As root, an agent without bwrap is started through `netns_exec.py`, which makes a new network
namespace (only `lo`, up) and only then switches to the sandbox uid; with bwrap,
`--unshare-net` does the same. Without root neither is possible for a plain process, and
sandboxes then share the host's network (its loopback services included) and, all running as
the orchestrator's own uid, each other's files: the service says so loudly at start and in
/healthz (`isolation`).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

LAUNCHER = Path(__file__).with_name("netns_exec.py")
PROBE_UID = 65534  # nobody: the probe runs /bin/true exactly as an agent would start


def netns_command(
    command: Sequence[str],
    *,
    uid: int,
    gid: int,
    groups: Sequence[int],
    cgroup_procs: Sequence[Path] = (),
    new_network: bool = True,
) -> list[str]:
    """`command` run as uid:gid with `groups` (the caller stays root), after joining the
    cgroups whose `cgroup.procs` files are given, in a new network namespace unless
    `new_network` is False (bwrap makes its own)."""
    options: list[str] = []
    for path in cgroup_procs:
        options += ["--cgroup-procs", str(path)]
    if not new_network:
        options.append("--keep-network")
    return [
        sys.executable, "-I", "-S", str(LAUNCHER), *options,
        str(uid), str(gid), ",".join(str(g) for g in groups), "--", *command,
    ]  # fmt: skip


@lru_cache(maxsize=1)
def netns_usable() -> tuple[bool, str]:
    """Whether this host lets us make network namespaces (checked once, by doing it)."""
    args = netns_command(["/bin/true"], uid=PROBE_UID, gid=PROBE_UID, groups=[])
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd="/")
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"the network-namespace launcher failed to run: {exc}"
    if out.returncode != 0:
        return False, out.stderr.strip()[-300:] or f"exit code {out.returncode}"
    return True, "ok"


@dataclass(frozen=True)
class Isolation:
    """What keeps one user's process-backend sandbox from another's and from the host."""

    users_isolated: bool  # a uid of its own AND a /tmp of its own (bwrap): nothing shared to write
    process_network: str  # "namespace": only lo; "host": the host's network
    uid_base: int
    reason: str | None = None  # why not isolated, for the operator
    # "cgroup": each sandbox's processes live and die in a cgroup of its own (killed, frozen,
    # limited by the kernel); "unbounded": found by scanning /proc, which a fork can outrun.
    process_lifetime: str = "unbounded"
    lifetime_reason: str | None = None
    limits: str = "none"  # where CPU/memory/pids limits are enforced: "v2", "v1" or "none"

    @property
    def complete(self) -> bool:
        return self.users_isolated and self.process_network == "namespace"

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "users_isolated": self.users_isolated,
            "process_network": self.process_network,
            "process_lifetime": self.process_lifetime,
            "process_limits": self.limits,
            "uid_base": self.uid_base,
        }
        if self.reason is not None:
            out["reason"] = self.reason
        if self.lifetime_reason is not None:
            out["lifetime_reason"] = self.lifetime_reason
        return out


HOST_TMP = "without bwrap every sandbox can write the host's /tmp (and read what others leave there)"


def decide_isolation(
    *,
    as_root: bool,
    bwrap: bool,
    netns: tuple[bool, str],
    uid_base: int,
    cgroups: tuple[bool, str | None, str] = (False, "not root: sandbox cgroups cannot be made", "none"),
) -> Isolation:
    """`cgroups`: (usable, why not, where limits apply) of orchestrator/sandboxes/cgroups.py."""
    if bwrap:
        network = "namespace"  # bwrap --unshare-net (its probe refuses to start agents otherwise)
        reason = None if as_root else "not root: every sandbox runs as the orchestrator's own uid"
    elif as_root and netns[0]:
        network, reason = "namespace", HOST_TMP
    elif as_root:
        network, reason = "host", f"network namespaces are not available: {netns[1]}; {HOST_TMP}"
    else:
        network = "host"
        reason = "not root: every sandbox runs as the orchestrator's own uid and shares the host's network"
    usable, why_not, limits = cgroups
    return Isolation(
        users_isolated=as_root and bwrap,
        process_network=network,
        uid_base=uid_base,
        reason=reason,
        process_lifetime="cgroup" if usable else "unbounded",
        lifetime_reason=None if usable else why_not,
        limits=limits if usable else "none",
    )
