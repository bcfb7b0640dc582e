"""What the docker backend takes as proof that a socket's peer is the user's sandbox
(docker_spec.sandbox_peer), pure: its uid under runc, its container under gVisor."""

from __future__ import annotations

from orchestrator.sandboxes.docker_spec import sandbox_peer
from sandbox_agent.peer import ExpectedPeer

CID = "4e894cbbefb71df57e4772495d91e3fba5eeaf1a726cfdac8f779984c624d16a"


def test_runc_vouches_by_the_sandbox_uid_and_runsc_by_the_container() -> None:
    assert sandbox_peer("runc", 100007, CID) == ExpectedPeer(uid=100007)
    # under gVisor the peer is the container's gofer, uid 0 like any root daemon: never by uid
    assert sandbox_peer("runsc", 100007, CID) == ExpectedPeer(container_id=CID)
    assert sandbox_peer("runsc", 100007, CID).uid is None
