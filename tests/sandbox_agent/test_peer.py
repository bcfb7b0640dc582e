"""Who is at the other end of a sandbox's socket (sandbox_agent/peer.py): the pure deciders,
and the check on real connected Unix sockets (this process as the peer)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sandbox_agent.peer import (
    ExpectedPeer,
    PeerCredentials,
    cgroup_names_container,
    check_socket_peer,
    peer_problem,
    read_cgroup,
)

CID = "4e894cbbefb71df57e4772495d91e3fba5eeaf1a726cfdac8f779984c624d16a"
OTHER = "31a575638c8c3e2f25a9eea38246256f7b89e146be6012ffd483b37c66b5299e"
CGROUP_V1 = f"""9:name=systemd:/docker/{CID}
4:memory:/docker/{CID}
1:cpu:/docker/{CID}
0::/
"""
CGROUP_V2_SYSTEMD = f"0::/system.slice/docker-{CID}.scope\n"
GOFER = PeerCredentials(pid=4242, uid=0, gid=0)


def test_a_cgroup_names_the_container_by_its_full_id_as_a_path_component() -> None:
    assert cgroup_names_container(CGROUP_V1, CID)
    assert cgroup_names_container(CGROUP_V2_SYSTEMD, CID)
    assert cgroup_names_container(f"0::/docker/{CID}\n", CID)
    assert not cgroup_names_container(CGROUP_V1, OTHER)  # another user's container
    assert not cgroup_names_container("0::/system.slice/docker.service\n", CID)  # dockerd itself
    # a prefix or a look-alike is not the container
    assert not cgroup_names_container(f"0::/docker/{CID}x\n", CID)
    assert not cgroup_names_container(f"0::/docker/x{CID}\n", CID)
    assert not cgroup_names_container(f"0::/docker-{CID}.scope.d\n", CID)


def test_a_peer_passes_with_one_of_the_expected_facts() -> None:
    in_container = ExpectedPeer(container_id=CID)
    assert peer_problem(in_container, GOFER, CGROUP_V1) is None
    assert peer_problem(ExpectedPeer(uid=1007), PeerCredentials(1, 1007, 1007), None) is None
    assert peer_problem(ExpectedPeer(uid=1007, container_id=CID), GOFER, CGROUP_V1) is None  # either fact
    # a root peer outside the container: dockerd's socket, another sandbox's gofer, a vanished pid
    for cgroup in ("0::/system.slice/docker.service\n", f"0::/docker/{OTHER}\n", None):
        problem = peer_problem(in_container, GOFER, cgroup)
        assert problem is not None and "pid 4242 uid 0" in problem and CID[:12] in problem
    problem = peer_problem(ExpectedPeer(uid=1007), GOFER, CGROUP_V1)  # runc: the uid, not the cgroup
    assert problem is not None and "uid 1007" in problem


def test_only_a_full_container_id_is_taken() -> None:
    with pytest.raises(ValueError):
        ExpectedPeer(container_id=CID[:12])
    with pytest.raises(ValueError):
        ExpectedPeer(container_id="../" + CID[3:])


def test_a_real_socket_peer_is_checked_by_uid_and_by_its_cgroup(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(path)
        assert check_socket_peer(client, ExpectedPeer(uid=os.geteuid())) is None
        assert check_socket_peer(client, ExpectedPeer(uid=os.geteuid() + 1)) is not None
        # this process's own cgroup: it is in no container of that id
        assert check_socket_peer(client, ExpectedPeer(uid=os.geteuid() + 1, container_id=CID)) is not None
        own = read_cgroup(os.getpid())
        assert own is not None and own.strip()
    finally:
        client.close()
        server.close()
