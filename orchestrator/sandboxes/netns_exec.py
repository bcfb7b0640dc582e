"""Start a command in its cgroups and a new, empty network namespace, then as a sandbox uid
(run as root).

    python -I -S netns_exec.py [--cgroup-procs FILE]... [--keep-network] UID GID GIDS -- COMMAND...
    (GIDS: comma-separated, may be empty)

The process backend (as root) launches every agent through this. First it writes its own pid
into each `cgroup.procs` given (orchestrator/sandboxes/cgroups.py): the agent, and everything
it will ever fork, is in the sandbox's cgroups before it runs a line of its own. Then (unless
`--keep-network`: bwrap makes its own) a new network namespace, so a sandbox has only `lo`,
like docker's `none` network: no host loopback services (the orchestrator's own API), no
outside network. The namespace must be made while still root (CAP_SYS_ADMIN), so the identity
switch happens here, after it, and not in subprocess.Popen. The agent's Unix socket lives on
the filesystem and works across network namespaces.

Standalone on purpose (standard library only, no project imports, `-S`): it costs one short
interpreter start per agent start, nothing per tool call. Exits 125 with one line on stderr
when any step fails: an agent never runs with more network or privilege than asked for.
"""

import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def fail(step: str, error: object) -> None:
    sys.stderr.write(f"netns_exec: {step} failed: {error}\n")
    sys.stderr.flush()
    os._exit(125)


def new_network_namespace() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        fail("unshare(CLONE_NEWNET)", os.strerror(errno))


def loopback_up() -> None:
    """A new namespace's `lo` is down; a sandbox may still talk to itself (a dev server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def join_cgroups(procs_files: list) -> None:
    for path in procs_files:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            fail(f"joining the cgroup {path}", exc)


def main(argv: list) -> None:
    procs_files, keep_network = [], False
    while argv and argv[0] in ("--cgroup-procs", "--keep-network"):
        if argv[0] == "--keep-network":
            keep_network, argv = True, argv[1:]
        elif len(argv) > 1:
            procs_files.append(argv[1])
            argv = argv[2:]
        else:
            fail("parsing the arguments", "--cgroup-procs needs a file")
    try:
        uid, gid, gids_csv, separator, *command = argv
        uid_n, gid_n = int(uid), int(gid)
        gids = [int(g) for g in gids_csv.split(",") if g]
    except ValueError:
        fail("parsing the arguments", "usage: netns_exec.py UID GID GIDS -- COMMAND...")
    if separator != "--" or not command:
        fail("parsing the arguments", "usage: netns_exec.py UID GID GIDS -- COMMAND...")
    join_cgroups(procs_files)
    if not keep_network:
        new_network_namespace()
        try:
            loopback_up()
        except OSError as exc:
            fail("bringing lo up", exc)
    try:
        os.setgroups(gids)
        os.setresgid(gid_n, gid_n, gid_n)
        os.setresuid(uid_n, uid_n, uid_n)
    except OSError as exc:
        fail("switching to the sandbox uid", exc)
    if os.getresuid() != (uid_n, uid_n, uid_n) or os.getresgid() != (gid_n, gid_n, gid_n):
        fail("switching to the sandbox uid", f"still {os.getresuid()}/{os.getresgid()}")
    try:
        os.execv(command[0], command)
    except OSError as exc:
        fail(f"executing {command[0]}", exc)


if __name__ == "__main__":
    main(sys.argv[1:])
