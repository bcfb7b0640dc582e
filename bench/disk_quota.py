"""Disk quotas (issue 17, the disk half): what the quota bookkeeping costs a tool call, side by
side, and what the non-root scan costs for N files.

Starts three real `orchestrator serve` (process backend) on loopback, one per mechanism
(`off`, `loop`: a loop-mounted ext4 image per user, `scan`: the periodic usage scan), warms one
user's sandbox on each and times warm `read_file` and `write_file` calls in interleaved rounds,
so the three see the same machine at the same time. The loop path adds no work to a call (the
kernel enforces the quota); the scan path adds one set lookup for writing tools. Also: a user's
first sandbox start with an image (mkfs + mount + binds) against one without, and the scan's
cost for N files (lstat walk on directory fds).

Run (as root for the loop server): .venv/bin/python bench/disk_quota.py   (prints `name: value unit`)
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import bench_dir, orchestrator_server, pct  # noqa: E402
from mounts.layout import DataLayout  # noqa: E402
from orchestrator.quotas.scan import scan_usage  # noqa: E402
from orchestrator.quotas.volumes import LoopVolumes  # noqa: E402

ROUNDS = 300
MECHANISMS = ("off", "loop", "scan") if os.geteuid() == 0 else ("off", "scan")


def timed_ms(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def tool_calls(base: Path) -> None:
    with ExitStack() as stack:
        servers, runs, first = {}, {}, {}
        uid_base = int(os.environ.get("ORCH_SANDBOX_UID_BASE", "100000"))
        for index, mechanism in enumerate(MECHANISMS):
            settings = {
                "ORCH_DATA_DIR": str(base / mechanism),
                "ORCH_BACKEND": "process",
                "ORCH_DISK_QUOTA": mechanism,
                "ORCH_USER_DISK_QUOTA_MB": "64",
                "ORCH_USER_INODE_QUOTA": "10000",
                "ORCH_SHARED_DISK_QUOTA_MB": "16",
                "ORCH_SHARED_INODE_QUOTA": "1000",
                "ORCH_DISK_UNMOUNT_ON_CLOSE": "true",
                # Three servers at once: each its own block of sandbox uids.
                "ORCH_SANDBOX_UID_BASE": str(uid_base + index * 200_000),
                "ORCH_MAX_USER_ID": "100000",
            }
            (base / mechanism).mkdir()
            stack.callback(lambda d=base / mechanism: LoopVolumes(DataLayout(d)).unmount_all() if d.exists() else 0)
            servers[mechanism] = server = stack.enter_context(orchestrator_server(settings, what=f"the {mechanism} server"))
            runs[mechanism] = run = server.new_run(7)["run_id"]
            first[mechanism] = timed_ms(lambda: server.result(run, "write_file", path="warm.txt", content="warm"))
        samples: dict[tuple[str, str], list[float]] = {(m, t): [] for m in MECHANISMS for t in ("read_file", "write_file")}
        for i in range(ROUNDS):
            for mechanism in MECHANISMS:
                server, run = servers[mechanism], runs[mechanism]
                samples[(mechanism, "read_file")].append(timed_ms(lambda: server.result(run, "read_file", path="warm.txt")))
                samples[(mechanism, "write_file")].append(
                    timed_ms(lambda: server.result(run, "write_file", path="w.txt", content=f"round {i}"))
                )
        for mechanism in MECHANISMS:
            print(f"first_sandbox_start_{mechanism}: {first[mechanism]:.1f} ms")
        for tool in ("read_file", "write_file"):
            off = statistics.median(samples[("off", tool)])
            for mechanism in MECHANISMS:
                values = samples[(mechanism, tool)]
                median = statistics.median(values)
                print(f"{tool}_{mechanism}_median: {median:.3f} ms")
                print(f"{tool}_{mechanism}_p99: {pct(values, 0.99):.3f} ms")
                if mechanism != "off":
                    print(f"{tool}_{mechanism}_vs_off: {median / off:.3f} ratio")


def guard_cost() -> None:
    """What a call pays for disk quotas: the router's guard (over quota, or over a member's share
    of a shared place), registered with `scan` and `loop` alike; `off` registers none (the
    empty loop printed as `call_guard_off`)."""
    from orchestrator.quotas.service import DiskQuotas
    from orchestrator.settings import DiskQuotaSettings, Settings

    quotas = DiskQuotas(DiskQuotaSettings.of(Settings(disk_quota="scan", data_dir=REPO)), sandbox_uid=lambda uid: uid)
    guards_quota, guards_none = [quotas.refuse_write], []
    n = 1_000_000
    for name, guards in (("quota", guards_quota), ("off", guards_none)):
        t0 = time.perf_counter()
        for _ in range(n):
            for guard in guards:
                guard(7, "write_file", {"path": "out.txt"})
        print(f"call_guard_{name}: {(time.perf_counter() - t0) / n * 1e9:.0f} ns")


def image_cost(base: Path) -> None:
    """A user's first image in-process: mkfs of a 64 MiB sparse image, loop mount, five binds;
    then the same call once it is mounted (what every later sandbox start pays)."""
    from orchestrator.quotas.model import Limits, user_volume

    data = base / "image"
    data.mkdir()
    (data / "state").mkdir(mode=0o700)
    volumes = LoopVolumes(DataLayout(data))
    made, again = [], []
    for user in range(1, 6):
        volume = user_volume(volumes.layout, user)
        made.append(timed_ms(lambda: volumes.ensure(volume, Limits(64, 10000), create=True, owner_ok=lambda uid: True)))
        again.append(timed_ms(lambda: volumes.ensure(volume, Limits(64, 10000), create=True, owner_ok=lambda uid: True)))
    volumes.unmount_all()
    print(f"user_image_make_mount_bind_median: {statistics.median(made):.1f} ms")
    print(f"user_image_already_mounted_median: {statistics.median(again) * 1000:.1f} us")


def scan_cost(base: Path) -> None:
    for count in (1_000, 10_000, 50_000):
        root = base / f"scan-{count}"
        place = root / "place"
        for d in range(count // 100):
            sub = place / f"d{d}"
            sub.mkdir(parents=True)
            for n in range(100):
                (sub / f"f{n}").write_bytes(b"x" * 100)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            usage = scan_usage(root, [place], volume="user-1", bytes_limit=2**40, inodes_limit=10**7, max_entries=10**7)
            runs.append((time.perf_counter() - t0) * 1000)
        assert usage.inodes_used == count + count // 100, usage
        best = min(runs)
        print(f"scan_{count}_files: {best:.1f} ms")
        print(f"scan_{count}_per_entry: {best * 1000 / (count + count // 100):.2f} us")
        shutil.rmtree(root)


def main() -> None:
    base = bench_dir("disk-quota-")
    try:
        tool_calls(base)
        guard_cost()
        if os.geteuid() == 0:
            image_cost(base)
        scan_cost(base)
    finally:
        for data in base.iterdir():
            LoopVolumes(DataLayout(data)).unmount_all()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
