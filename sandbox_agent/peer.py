"""Who is at the other end of a sandbox's Unix socket (the agent's, or the egress proxy's): the
facts the host checks before it sends a token or serves a connection, whatever the socket's
path led to.

- `uid`: the peer's uid (SO_PEERCRED) is the sandbox's own uid. True of a sandbox that runs on
  the host's kernel (runc, bwrap): its agent is a host process of that uid.
- `container_id`: the peer process is in that container's cgroup. Under gVisor (runsc) a
  socket the sandbox binds or connects to on the host is the gofer's, a root process of the
  sandbox's own container, so the uid says nothing; its cgroup says whose it is. A sandbox
  under gVisor makes no host processes, so it cannot bring a recycled pid to the check either.

A peer passes when it shows one of the facts asked for (each vouches for the same sandbox).
"""

from __future__ import annotations

import re
import socket
import struct
from dataclasses import dataclass

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
CGROUP_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class ExpectedPeer:
    uid: int | None = None
    container_id: str | None = None

    def __post_init__(self) -> None:
        if self.container_id is not None and not _CONTAINER_ID.fullmatch(self.container_id):
            raise ValueError(f"not a full container id: {self.container_id!r}")

    def describe(self) -> str:
        facts = ([f"uid {self.uid}"] if self.uid is not None else []) + (
            [f"a process of container {self.container_id[:12]}"] if self.container_id is not None else []
        )
        return " or ".join(facts) or "anyone"


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    pid, uid, gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return PeerCredentials(pid, uid, gid)


def cgroup_names_container(cgroup_text: str, container_id: str) -> bool:
    """Pure: whether /proc/<pid>/cgroup puts the process in the container: a path component
    that is the full id (cgroupfs: `/docker/<id>`) or its systemd scope (`docker-<id>.scope`)."""
    names = {container_id, f"docker-{container_id}.scope"}
    for line in cgroup_text.splitlines():
        _, _, path = line.partition(":")[2].partition(":")
        if names & set(path.split("/")):
            return True
    return False


def peer_problem(expected: ExpectedPeer, peer: PeerCredentials, cgroup_text: str | None) -> str | None:
    """Pure: None when the peer shows one of the expected facts, else what it is instead.
    `cgroup_text` is the peer's /proc/<pid>/cgroup (None: unreadable, e.g. it is gone)."""
    if expected.uid is not None and peer.uid == expected.uid:
        return None
    if expected.container_id is not None and cgroup_text is not None:
        if cgroup_names_container(cgroup_text, expected.container_id):
            return None
    return f"its peer is pid {peer.pid} uid {peer.uid}, not {expected.describe()}"


def read_cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return f.read(CGROUP_MAX_BYTES).decode(errors="replace")
    except OSError:
        return None


def check_socket_peer(sock: socket.socket, expected: ExpectedPeer) -> str | None:
    """None when the connected socket's peer is the expected one, else why not."""
    try:
        peer = peer_credentials(sock)
    except OSError as exc:
        return f"its peer is unknown ({exc.strerror})"
    needs_cgroup = expected.container_id is not None and peer.uid != expected.uid and peer.pid > 0
    return peer_problem(expected, peer, read_cgroup(peer.pid) if needs_cgroup else None)
