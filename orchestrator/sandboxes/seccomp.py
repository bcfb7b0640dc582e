"""The docker sandboxes' seccomp profile (docs/docker.md, "Seccomp").

Engines before Docker 25 allow the io_uring calls in their default profile; io_uring is a
large kernel attack surface that needs no capability, and the agents never use it. A custom
profile replaces the engine's default one (they do not stack), and the engine's own profile
is not something this project may copy, so this one is written here as a deny list: it allows
what is not named and refuses, with EPERM, the calls an unprivileged sandbox has no business
making — io_uring, new namespaces (unshare, setns, namespace flags of clone; clone3 answers
ENOSYS so the C library falls back to clone, whose flags can be checked), the kernel keyring,
BPF, perf events, userfaultfd, module and kexec loading, the mount API and a few legacy calls.
Calls of another architecture's table (e.g. i386 on x86_64) are not matched by the profile and
are killed by the engine's seccomp setup.

Together with `cap_drop=ALL` and `no-new-privileges` (which already stop mount, module loading,
raw I/O and the like), this keeps the attack surface of the default profile's denials.
"""

from __future__ import annotations

import json
from functools import lru_cache

EPERM, ENOSYS = 1, 38

DENIED = (
    # io_uring: its own syscall surface, outside most other seccomp and LSM checks
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # namespaces (user namespaces unlock kernel code paths otherwise needing capabilities)
    "unshare", "setns",
    # kernel facilities an agent never needs
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "fanotify_init", "lookup_dcookie", "kcmp", "pidfd_getfd",
    # NUMA policy: the engine's default allows these only with CAP_SYS_NICE
    "mbind", "set_mempolicy", "move_pages", "migrate_pages",
    # what needs capabilities anyway: refused before the kernel looks further
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "open_tree", "move_mount", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    "uselib", "ustat", "sysfs", "_sysctl",
)  # fmt: skip
# clone's flags are its first argument on x86_64 and aarch64.
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


def seccomp_profile() -> dict[str, object]:
    denied = list(DENIED)
    rules: list[dict[str, object]] = [
        {"names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
    ]
    for flag in CLONE_NAMESPACE_FLAGS.values():
        rules.append(
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
            }
        )
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}


@lru_cache(maxsize=1)
def seccomp_security_opt() -> str:
    """The `security_opt` entry: the engine takes the profile's JSON itself, not a file name."""
    return "seccomp=" + json.dumps(seccomp_profile(), separators=(",", ":"), sort_keys=True)
