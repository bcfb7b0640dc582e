"""Which cgroup directories and files a process-backend sandbox gets (pure: no kernel needed),
and the real thing on this host when it runs as root: joined before the first fork, killed to
the last process, frozen."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.sandboxes.cgroups import (
    CgroupError,
    CgroupMounts,
    SandboxCgroups,
    SandboxLimits,
    parse_cgroup_mounts,
    parse_events,
    plan_cgroup,
)
from orchestrator.sandboxes.netns import netns_command
from orchestrator.sandboxes.warden import parse_line, sandbox_cgroup_path

LIMITS = SandboxLimits(cpus=1.5, memory_bytes=256 * 2**20, pids=64)

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = "8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
PURE_V2_MOUNTINFO = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_a_hybrid_host_has_v2_at_unified_and_v1_below_our_own_cgroups() -> None:
    mounts = parse_cgroup_mounts(HYBRID_MOUNTINFO, HYBRID_CGROUP)
    assert mounts.v2 == Path("/sys/fs/cgroup/unified")
    assert mounts.v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu"),
        "memory": Path("/sys/fs/cgroup/memory/process_api/abc"),  # inside whatever bounds us
        "pids": Path("/sys/fs/cgroup/pids"),
    }


def test_a_pure_v2_host_has_everything_at_sys_fs_cgroup() -> None:
    mounts = parse_cgroup_mounts(PURE_V2_MOUNTINFO, "0::/system.slice/orch.service\n")
    assert mounts == CgroupMounts(v2=Path("/sys/fs/cgroup"), v1={})


def test_v1_limits_where_v2_offers_no_controllers() -> None:
    plan = plan_cgroup(
        parse_cgroup_mounts(HYBRID_MOUNTINFO, HYBRID_CGROUP), uid_base=7000, sandbox_uid=7017, limits=LIMITS,
        v2_controllers=frozenset(),
    )  # fmt: skip
    assert plan.limited_by == "v1"
    assert plan.v2_dir == Path("/sys/fs/cgroup/unified/sandbox-orchestrator-7000/user-7017")
    assert dict(plan.writes) == {
        Path("/sys/fs/cgroup/pids/sandbox-orchestrator-7000/user-7017/pids.max"): "64",
        Path("/sys/fs/cgroup/memory/process_api/abc/sandbox-orchestrator-7000/user-7017/memory.limit_in_bytes"): str(256 * 2**20),
        Path("/sys/fs/cgroup/cpu/sandbox-orchestrator-7000/user-7017/cpu.cfs_period_us"): "100000",
        Path("/sys/fs/cgroup/cpu/sandbox-orchestrator-7000/user-7017/cpu.cfs_quota_us"): "150000",
    }
    assert plan.procs[0] == plan.v2_dir / "cgroup.procs" and len(plan.procs) == 4  # v2 and the three v1
    assert all(d.name == "user-7017" for d in plan.remove) and len(plan.remove) == 4  # instance dirs stay
    assert plan.create.index(plan.v2_dir.parent) < plan.create.index(plan.v2_dir)  # parents first


def test_v2_limits_where_the_v2_cgroup_offers_its_controllers() -> None:
    plan = plan_cgroup(
        CgroupMounts(v2=Path("/sys/fs/cgroup"), v1={}), uid_base=1, sandbox_uid=2, limits=LIMITS,
        v2_controllers=frozenset({"cpu", "memory", "pids", "io"}),
    )  # fmt: skip
    leaf = Path("/sys/fs/cgroup/sandbox-orchestrator-1/user-2")
    assert plan.limited_by == "v2" and plan.procs == (leaf / "cgroup.procs",)
    assert plan.writes[0] == (leaf.parent / "cgroup.subtree_control", "+cpu +memory +pids")  # before the leaf's files
    assert dict(plan.writes)[leaf / "cpu.max"] == "150000 100000"
    assert dict(plan.writes)[leaf / "memory.max"] == str(256 * 2**20)
    assert dict(plan.writes)[leaf / "pids.max"] == "64"


def test_no_limits_but_kill_and_freeze_without_any_controller() -> None:
    plan = plan_cgroup(
        CgroupMounts(v2=Path("/sys/fs/cgroup"), v1={}), uid_base=1, sandbox_uid=2, limits=LIMITS,
        v2_controllers=frozenset({"cpu"}),
    )  # fmt: skip
    assert plan.limited_by == "none" and plan.writes == ()


def test_names_come_from_integers_only() -> None:
    mounts = CgroupMounts(v2=Path("/sys/fs/cgroup"), v1={})
    with pytest.raises(CgroupError):
        plan_cgroup(mounts, uid_base=-1, sandbox_uid=2, limits=LIMITS, v2_controllers=frozenset())
    with pytest.raises(CgroupError):
        plan_cgroup(CgroupMounts(v2=None, v1={}), uid_base=1, sandbox_uid=2, limits=LIMITS, v2_controllers=frozenset())


def test_events_parse() -> None:
    assert parse_events("populated 1\nfrozen 0\n") == {"populated": "1", "frozen": "0"}


def test_the_warden_takes_only_sandbox_cgroup_paths() -> None:
    cgroups: set[Path] = set()
    good = "/sys/fs/cgroup/unified/sandbox-orchestrator-100000/user-100017"
    for line in (f"cgroup {good}", "cgroup /sys/fs/cgroup", "cgroup relative/sandbox-orchestrator-1/user-2",
                 "cgroup /sys/fs/cgroup/sandbox-orchestrator-1/../user-2", "cgroup /x/sandbox-orchestrator-a/user-2"):  # fmt: skip
        parse_line(line, {}, cgroups)
    assert cgroups == {Path(good)}
    parse_line(f"uncgroup {good}", {}, cgroups)
    assert cgroups == set() and sandbox_cgroup_path("/etc") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root")
def test_a_launched_process_is_in_its_cgroup_before_it_forks_and_dies_with_it() -> None:
    cgroups = SandboxCgroups(1_990_000_000, LIMITS)
    if not cgroups.usable:
        pytest.skip(f"no sandbox cgroups here: {cgroups.reason}")
    plan = cgroups.prepare(1_990_000_001)
    try:
        # Forks children that fork again; every one of them is in the sandbox's cgroup.
        script = "import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(30)\n"
        command = netns_command(
            ["/usr/bin/python3", "-c", script], uid=65534, gid=65534, groups=[], cgroup_procs=plan.procs, new_network=False
        )
        proc = subprocess.Popen(command)
        deadline = time.monotonic() + 10
        while len((plan.v2_dir / "cgroup.procs").read_text().split()) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        members = {int(pid) for pid in (plan.v2_dir / "cgroup.procs").read_text().split()}
        assert proc.pid in members and len(members) == 8
        for procs in plan.procs[1:]:  # the v1 hierarchies hold the same processes
            assert {int(pid) for pid in procs.read_text().split()} == members
        assert cgroups.freeze(plan) and parse_events((plan.v2_dir / "cgroup.events").read_text())["frozen"] == "1"
        assert cgroups.kill(plan)  # frozen or not
        assert proc.wait(5) == -9
        assert not plan.v2_dir.exists()
    finally:
        cgroups.kill(plan)
        cgroups.close()
