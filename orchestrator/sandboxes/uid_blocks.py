"""Whether this instance's sandbox uid block overlaps that of another live orchestrator on the host.

A user's sandbox runs as uid `ORCH_SANDBOX_UID_BASE + user id`, so an instance owns the block
base..base + ORCH_MAX_USER_ID. Two instances whose blocks overlap would run some users' sandboxes
as the same uid: each sandbox agent sweeps every process of its uid after a call (it would kill
the other instance's agent) and the sandboxes could read each other's files. The claims of the
live instances come from `uid_registry.py`; this module only decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class UidBlock:
    first: int
    last: int

    @classmethod
    def of(cls, base: int, max_user_id: int) -> UidBlock:
        # The base itself is taken too: it is the gid every sandbox of the instance shares.
        return cls(base, base + max_user_id)

    def overlaps(self, other: UidBlock) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Claim:
    """One instance's block, as recorded in the host-wide registry."""

    instance_id: str
    data_dir: str
    block: UidBlock
    pid: int


def overlapping_claim(ours: Claim, others: Iterable[Claim]) -> Claim | None:
    """The first live claim of ANOTHER instance whose block overlaps ours; None: ours is free.
    A claim of our own instance id is not a conflict here (a second server on one data dir is
    refused elsewhere)."""
    for other in others:
        if other.instance_id != ours.instance_id and other.block.overlaps(ours.block):
            return other
    return None


def conflict_message(ours: UidBlock, other: Claim) -> str:
    return (
        f"sandbox uids {ours.first}..{ours.last} of this instance overlap those of the orchestrator on "
        f"{other.data_dir} (uids {other.block.first}..{other.block.last}); give one of them another "
        "ORCH_SANDBOX_UID_BASE / a smaller ORCH_MAX_USER_ID"
    )
