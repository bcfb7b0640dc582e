"""The docker sandboxes' seccomp profile (docs/docker.md, "Seccomp"): an allow list.

A custom profile replaces the engine's default one (they do not stack), and the engine's own
profile is not something this project may copy, so this list is our own: the system calls an
ordinary unprivileged Linux program makes (files, memory, processes and threads, signals,
time, sockets, pipes and event loops, System V and POSIX IPC), in the spirit of the engine's
default. Everything else answers EPERM, so a call a kernel adds later is refused until it is
looked at. Left out on purpose, among others:
- io_uring (its own syscall surface, outside most other seccomp and LSM checks; engines before
  Docker 25 allow it), new namespaces (unshare, setns; clone only without namespace flags, and
  clone3 answers ENOSYS so the C library falls back to clone, whose flags can be checked);
- the kernel keyring, BPF, perf events, userfaultfd, fanotify, kcmp, pidfd_getfd,
  memfd_secret, NUMA policy changes (mbind, set_mempolicy, set_mempolicy_home_node,
  move_pages, migrate_pages), modify_ldt, process_madvise;
- what needs a capability anyway (mount API, module and kexec loading, reboot, swap, clock
  setting, raw I/O ports, quotactl, syslog, chroot, file handles).
Two calls are allowed only with some arguments: socket and socketpair for the address families
a program needs (Unix, IPv4, IPv6; not AF_VSOCK, which reaches the hypervisor on a VM host),
netlink sockets only for the routing and socket-diagnostics protocols (interfaces, addresses,
`ss`: the container's own network namespace); not NETLINK_KOBJECT_UEVENT, whose device events
the kernel broadcasts to every network namespace of the initial user namespace, a container's
included (another user's loop image attached, a container's veth pair), and personality for
the values the engine's default allows (the default persona, 32-bit Linux, UNAME26, and the
query).

Calls of another architecture's table (e.g. i386 on x86_64) are not matched by the profile and
are killed by the engine's seccomp setup. Together with `cap_drop=ALL` and `no-new-privileges`.
The agent itself is protected from the sandbox's own processes (ptrace, process_vm_readv,
/proc/<pid>/mem, all allowed between processes of one uid) by being undumpable
(sandbox_agent/supervisor.py).
"""

from __future__ import annotations

import json
from functools import lru_cache

EPERM, ENOSYS = 1, 38

ALLOWED = (
    # files and directories
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "dup", "dup2", "dup3",
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2",
    "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "rename", "renameat",
    "renameat2", "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat",
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask",
    "truncate", "ftruncate", "fallocate", "fadvise64", "readahead", "fsync", "fdatasync", "sync", "syncfs",
    "sync_file_range", "flock", "fcntl", "ioctl", "mknod", "mknodat", "utime", "utimes", "utimensat",
    "futimesat", "copy_file_range", "sendfile", "splice", "tee", "vmsplice",
    "getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr", "listxattr", "llistxattr",
    "flistxattr", "removexattr", "lremovexattr", "fremovexattr",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    # memory
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "msync", "mincore", "mlock", "mlock2",
    "munlock", "mlockall", "munlockall", "memfd_create", "membarrier", "get_mempolicy", "remap_file_pages",
    "pkey_alloc", "pkey_free", "pkey_mprotect",
    # processes and threads (clone: below, with its flags checked)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "kill", "tkill", "tgkill",
    "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp", "getsid", "setsid",
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid", "setgid",
    "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid", "capget", "capset",
    "prctl", "arch_prctl", "set_tid_address", "set_robust_list", "get_robust_list", "rseq", "futex",
    "futex_waitv", "get_thread_area", "set_thread_area", "getrlimit", "setrlimit", "prlimit64", "getrusage",
    "getpriority", "setpriority", "ioprio_get", "ioprio_set", "sched_yield", "sched_getaffinity",
    "sched_setaffinity", "sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler",
    "sched_getattr", "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "getcpu", "seccomp", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_open", "pidfd_send_signal", "map_shadow_stack", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    "uname", "sysinfo", "times", "getrandom",
    # signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "signalfd", "signalfd4", "pause", "restart_syscall",
    # time
    "time", "gettimeofday", "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "alarm",
    "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun",
    "timer_delete", "timerfd_create", "timerfd_settime", "timerfd_gettime",
    # waiting on descriptors
    "pipe", "pipe2", "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
    # sockets (socket and socketpair: below, by address family)
    "bind", "connect", "listen", "accept", "accept4", "getsockname", "getpeername", "getsockopt",
    "setsockopt", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown",
    # System V and POSIX IPC (in the container's own IPC namespace)
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
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
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
AF_NETLINK = 16
# socket's third argument for AF_NETLINK: the protocols a sandbox's own programs need.
NETLINK_PROTOCOLS = {"NETLINK_ROUTE": 0, "NETLINK_SOCK_DIAG": 4}
# The default persona, PER_LINUX32, UNAME26, both, and 0xffffffff (which only asks).
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)


def _only_if(name: str, value: int, *, mask: int | None = None, third: int | None = None) -> dict[str, object]:
    """Allow `name` when its first argument equals `value` (after `& mask`, when given), and its
    third equals `third` when given (the conditions of one rule must all hold)."""
    arg: dict[str, object] = {"index": 0, "value": value, "op": "SCMP_CMP_EQ"}
    if mask is not None:
        arg = {"index": 0, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}
    args = [arg]
    if third is not None:
        args.append({"index": 2, "value": third, "op": "SCMP_CMP_EQ"})
    return {"names": [name], "action": "SCMP_ACT_ALLOW", "args": args}


def seccomp_profile() -> dict[str, object]:
    namespaces = 0
    for flag in CLONE_NAMESPACE_FLAGS.values():
        namespaces |= flag
    rules: list[dict[str, object]] = [
        {"names": list(ALLOWED), "action": "SCMP_ACT_ALLOW"},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
        _only_if("clone", 0, mask=namespaces),  # no namespace flag set
    ]
    for family in SOCKET_FAMILIES.values():
        rules += [_only_if("socket", family), _only_if("socketpair", family)]
    rules += [_only_if("socket", AF_NETLINK, third=protocol) for protocol in NETLINK_PROTOCOLS.values()]
    rules += [_only_if("personality", value) for value in PERSONALITIES]
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": EPERM, "syscalls": rules}


@lru_cache(maxsize=1)
def seccomp_security_opt() -> str:
    """The `security_opt` entry: the engine takes the profile's JSON itself, not a file name."""
    return "seccomp=" + json.dumps(seccomp_profile(), separators=(",", ":"), sort_keys=True)
