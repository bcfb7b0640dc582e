"""The mount plan as a real mount namespace for the process backend (where bwrap is
installed it may apply the plan's mounts), opt-in with `ORCH_PROCESS_SANDBOX=bwrap`.

Inside, the agent and its shells see the system read-only (/usr, /etc and the merged-/usr
links), /dev with a /dev/shm of ORCH_SANDBOX_SHM_MB (a tmpfs of its own), a /proc of their
own, and exactly the plan's mounts at their sandbox paths (`tmp/{uid}` at /tmp); no network (a
new, empty network namespace), no other user's or host-only directory.

A PID namespace of its own (`--unshare-pid`): bwrap is its init, the agent its first child;
the agent's sweeps see and kill only the sandbox's processes, and when the namespace's init
dies the kernel kills everything left in it. `--die-with-parent`: bwrap gets SIGKILL when the
orchestrator dies (however it dies), so the whole namespace ends with it; the agent, which
cannot see the orchestrator's pid from inside, does not watch it itself.

`bwrap_command` is a pure function of the plan; `BwrapProbe` checks once that bwrap works for
sandbox uids (it needs unprivileged user namespaces when not setuid).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mounts.plan import Access, MountPlan

SYSTEM_READ_ONLY = ("/usr", "/etc")
TOP_LEVEL_LIBS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ISOLATION_FLAGS = (
    "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-pid", "--unshare-cgroup-try",
    "--new-session", "--die-with-parent",
)  # fmt: skip
MIB = 1024 * 1024


@dataclass(frozen=True)
class HostSystem:
    """How the host's top-level library dirs look: merged-/usr symlinks or real dirs."""

    links: tuple[tuple[str, str], ...]  # (link target, path)
    dirs: tuple[str, ...]

    @classmethod
    def inspect(cls) -> HostSystem:
        links, dirs = [], []
        for path in TOP_LEVEL_LIBS:
            if os.path.islink(path):
                links.append((os.readlink(path), path))
            elif os.path.isdir(path):
                dirs.append(path)
        return cls(tuple(links), tuple(dirs))


def interpreter_mounts(python: str) -> tuple[str, ...]:
    """Extra read-only mounts an interpreter outside /usr needs (e.g. a pyenv build)."""
    real = os.path.realpath(python)
    if any(real.startswith(p + "/") for p in SYSTEM_READ_ONLY):
        return ()
    base = os.path.realpath(sys.base_prefix)
    if real.startswith(base + "/"):
        return (base,)
    return (str(Path(real).parent.parent),)


def bwrap_command(
    plan: MountPlan,
    command: Sequence[str],
    *,
    chdir: Path,
    system: HostSystem,
    shm_mb: int,
    extra_read_only: Sequence[str] = (),
    bwrap: str = "bwrap",
) -> list[str]:
    args = [bwrap, *ISOLATION_FLAGS]
    for path in SYSTEM_READ_ONLY:
        args += ["--ro-bind", path, path]
    for target, path in system.links:
        args += ["--symlink", target, path]
    for path in system.dirs:
        args += ["--ro-bind", path, path]
    # /dev's own tmpfs is sized from the host's RAM; /dev/shm gets a bounded one.
    args += ["--dev", "/dev", "--size", str(shm_mb * MIB), "--tmpfs", "/dev/shm", "--proc", "/proc"]
    for path in extra_read_only:
        args += ["--ro-bind", path, path]
    # Shallow mounts first: /tmp before a data dir that happens to live below /tmp.
    for mount in sorted(plan.mounts, key=lambda m: (len(m.sandbox_path.parts), str(m.sandbox_path))):
        flag = "--bind" if mount.access is Access.READ_WRITE else "--ro-bind"
        args += [flag, str(mount.host_path), str(mount.sandbox_path)]
    args += ["--chdir", str(chdir), "--", *command]
    return args


class BwrapProbe:
    """Whether bwrap can build a namespace as a given uid (checked once, by running it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._result: tuple[bool, str] | None = None

    def check(self, uid: int | None) -> tuple[bool, str]:
        with self._lock:
            if self._result is None:
                self._result = self._run(uid)
            return self._result

    def _run(self, uid: int | None) -> tuple[bool, str]:
        binary = shutil.which("bwrap")
        if binary is None:
            return False, "bwrap is not installed"
        system = HostSystem.inspect()
        args = [binary, *ISOLATION_FLAGS]
        for path in SYSTEM_READ_ONLY:
            args += ["--ro-bind", path, path]
        for target, path in system.links:
            args += ["--symlink", target, path]
        args += ["--dev", "/dev", "--", "/bin/true"]
        identity = {"user": uid, "group": uid} if uid is not None else {}
        try:
            out = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd="/", **identity)  # type: ignore[call-overload]
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"bwrap failed to run: {exc}"
        if out.returncode != 0:
            return False, f"bwrap cannot create a namespace here: {out.stderr.strip()[-300:]}"
        return True, binary
