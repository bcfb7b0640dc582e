"""The pure side of disk quotas: which mechanism is in force, what a volume is, usage numbers
and the decisions made from them. No file is touched here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from mounts import ids
from mounts.layout import DataLayout, GroupRef

MIB = 1024 * 1024
# ext4 below this is mostly metadata; mkfs refuses much smaller images anyway.
MIN_IMAGE_MB = 8


class QuotaMechanism(str, Enum):
    LOOP = "loop"  # per-volume ext4 image: the kernel refuses a write past the limit
    SCAN = "scan"  # periodic usage scan: an over-quota sandbox is stopped, its writes refused
    OFF = "off"


@dataclass(frozen=True)
class MechanismChoice:
    mechanism: QuotaMechanism
    reason: str


def choose_mechanism(setting: str, *, is_root: bool, loop_problem: str | None) -> MechanismChoice:
    """`setting` is ORCH_DISK_QUOTA; `loop_problem` says why loop images cannot work here
    (None: they can). `loop` asked for but impossible is an error, never a silent downgrade."""
    if setting == "off":
        return MechanismChoice(QuotaMechanism.OFF, "ORCH_DISK_QUOTA=off")
    if setting == "scan":
        return MechanismChoice(QuotaMechanism.SCAN, "ORCH_DISK_QUOTA=scan")
    problem = "the orchestrator is not root" if not is_root else loop_problem
    if setting == "loop":
        if problem is not None:
            raise ValueError(f"ORCH_DISK_QUOTA=loop, but {problem}")
        return MechanismChoice(QuotaMechanism.LOOP, "ORCH_DISK_QUOTA=loop")
    if problem is None:
        return MechanismChoice(QuotaMechanism.LOOP, "auto: root with loop devices and mkfs.ext4")
    return MechanismChoice(QuotaMechanism.SCAN, f"auto: {problem}, so a periodic usage scan")


@dataclass(frozen=True)
class Place:
    """One read-write directory of a volume: `subdir` in the image, bound at `layout_path`."""

    subdir: str
    layout_path: Path


@dataclass(frozen=True)
class Volume:
    """One image: a user's private places, `share/`, or one group workspace."""

    key: str
    places: tuple[Place, ...]
    user_id: int | None = None  # the owner of a user volume (None: shared)

    def place(self, subdir: str) -> Place:
        for place in self.places:
            if place.subdir == subdir:
                return place
        raise KeyError(subdir)


# A user's read-write places: the plan purposes that live in the user's image. The socket
# directory stays out: it holds one socket and must work even when the image is full.
USER_PLACES = ("runtime", "uploads", "home", "deps", "tmp")


def user_volume(layout: DataLayout, user_id: int) -> Volume:
    uid = ids.user_id(user_id)
    paths = {
        "runtime": layout.runtime_user_dir(uid),
        "uploads": layout.uploads_dir(uid),
        "home": layout.home_dir(uid),
        "deps": layout.deps_dir(uid),
        "tmp": layout.tmp_dir(uid),
    }
    return Volume(f"user-{uid}", tuple(Place(name, paths[name]) for name in USER_PLACES), user_id=uid)


def share_volume(layout: DataLayout) -> Volume:
    return Volume("share", (Place("data", layout.share_dir),))


def group_volume(layout: DataLayout, group: GroupRef) -> Volume:
    # A digest: channel and chat id together can exceed one safe name, and may hold '_' or ':'.
    digest = hashlib.sha256(f"{group.channel}\0{group.chat_id}".encode()).hexdigest()[:40]
    return Volume(f"group-{digest}", (Place("data", layout.group_dir(group)),))


@dataclass(frozen=True)
class Limits:
    disk_mb: int
    inodes: int


@dataclass(frozen=True)
class DiskUsage:
    """A volume's usage against its quota: what the admin route shows and metrics read."""

    volume: str
    mechanism: QuotaMechanism
    bytes_used: int
    bytes_limit: int
    inodes_used: int
    inodes_limit: int
    # scan only: the walk stopped at its bound, so the figures are lower bounds.
    partial: bool = False

    @property
    def over_quota(self) -> bool:
        return self.bytes_used > self.bytes_limit or self.inodes_used > self.inodes_limit

    def summary(self) -> str:
        """`12.0 of 16.0 MiB, 230 of 256 files` (the words a no_space message uses)."""
        return (
            f"{self.bytes_used / MIB:.1f} of {self.bytes_limit / MIB:.1f} MiB, "
            f"{self.inodes_used} of {self.inodes_limit} files"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "volume": self.volume,
            "mechanism": self.mechanism.value,
            "bytes_used": self.bytes_used,
            "bytes_limit": self.bytes_limit,
            "inodes_used": self.inodes_used,
            "inodes_limit": self.inodes_limit,
            "over_quota": self.over_quota,
            "partial": self.partial,
        }


def usage_from_statvfs(volume: str, st: object, mechanism: QuotaMechanism = QuotaMechanism.LOOP) -> DiskUsage:
    """Usage of a mounted image from its statvfs (f_blocks excludes ext4's own metadata)."""
    frsize = st.f_frsize  # type: ignore[attr-defined]
    return DiskUsage(
        volume=volume,
        mechanism=mechanism,
        bytes_used=(st.f_blocks - st.f_bfree) * frsize,  # type: ignore[attr-defined]
        bytes_limit=st.f_blocks * frsize,  # type: ignore[attr-defined]
        inodes_used=st.f_files - st.f_ffree,  # type: ignore[attr-defined]
        inodes_limit=st.f_files,  # type: ignore[attr-defined]
    )


def no_space_message(original: str, usage: DiskUsage | None) -> str:
    """A sandbox write failed with ENOSPC/EDQUOT: say it is the quota and how full it is."""
    if usage is None:
        return original
    return (
        f"{original} (the disk quota of this volume ({usage.volume}) is full: {usage.summary()} used; "
        f"delete files to free space, or ask the operator for a larger quota)"
    )


def grow_problem(current_mb: int, wanted_mb: int) -> str | None:
    """Why a volume's size cannot change to `wanted_mb` (None: it can grow to it)."""
    if wanted_mb < MIN_IMAGE_MB:
        return f"a disk quota must be at least {MIN_IMAGE_MB} MiB"
    if wanted_mb < current_mb:
        return (
            f"shrinking from {current_mb} to {wanted_mb} MiB is refused: a mounted ext4 image can only grow online "
            "(shrinking needs the volume unmounted and checked, and could cut off data already written)"
        )
    return None


def free_pct(st: object) -> float:
    """Free space of a filesystem for unprivileged writers, in percent of its size."""
    blocks = st.f_blocks  # type: ignore[attr-defined]
    return 100.0 if blocks == 0 else 100.0 * st.f_bavail / blocks  # type: ignore[attr-defined]


def watermark_problem(free: float, min_free_pct: float) -> str | None:
    """Why the host refuses new sandbox starts and host writes (None: enough is free)."""
    if min_free_pct <= 0 or free >= min_free_pct:
        return None
    return (
        f"the data filesystem has {free:.1f}% free, below ORCH_MIN_FREE_DISK_PCT={min_free_pct:g}%; "
        "new sandboxes and host writes are refused until space is freed"
    )


# --- shared places: each member's share --------------------------------------------------------


@dataclass(frozen=True)
class OwnerUsage:
    """What the files of one owner take in a shared place."""

    bytes_used: int
    inodes_used: int


@dataclass(frozen=True)
class MemberShare:
    """How much of a shared place one member may hold (ORCH_SHARED_MEMBER_SHARE_PCT of it)."""

    bytes_limit: int
    inodes_limit: int


def member_share(volume: DiskUsage, pct: float) -> MemberShare:
    return MemberShare(int(volume.bytes_limit * pct / 100), int(volume.inodes_limit * pct / 100))


def anyone_may_be_over(volume: DiskUsage, share: MemberShare) -> bool:
    """Whether a member can hold more than its share: not while the whole place holds less than
    one share (then the per-owner walk is skipped)."""
    return volume.bytes_used > share.bytes_limit or volume.inodes_used > share.inodes_limit


@dataclass(frozen=True)
class MemberUsage:
    """One owner's files in a shared place against a member's share. `user_id` is None for a
    file owner that is no user's sandbox (root, the orchestrator)."""

    uid: int
    user_id: int | None
    bytes_used: int
    inodes_used: int
    share: MemberShare

    @property
    def over_share(self) -> bool:
        return self.bytes_used > self.share.bytes_limit or self.inodes_used > self.share.inodes_limit

    @property
    def who(self) -> str:
        return f"user {self.user_id}" if self.user_id is not None else f"uid {self.uid} (not a user's sandbox)"

    def summary(self) -> str:
        return f"{self.bytes_used / MIB:.1f} MiB in {self.inodes_used} files"

    def as_dict(self) -> dict[str, object]:
        return {
            "user_id": self.user_id,
            "uid": self.uid,
            "bytes_used": self.bytes_used,
            "inodes_used": self.inodes_used,
            "share_bytes": self.share.bytes_limit,
            "share_inodes": self.share.inodes_limit,
            "over_share": self.over_share,
        }


def needs_stop(member: MemberUsage, stopped_at: MemberUsage | None) -> bool:
    """Whether a round stops this member's sandbox: over its share, and not stopped yet at this
    usage or more (one that wrote more since its last stop, through a shell, is stopped again;
    one that stays put, deleting or doing its own work, is left running)."""
    if not member.over_share or member.user_id is None:
        return False
    if stopped_at is None:
        return True
    return member.bytes_used > stopped_at.bytes_used or member.inodes_used > stopped_at.inodes_used


def members_of(owners: dict[int, OwnerUsage], share: MemberShare, user_of_uid: Callable[[int], int | None]) -> list[MemberUsage]:
    """Each owner of a shared place's files as a member, the largest holder first."""
    found = [MemberUsage(uid, user_of_uid(uid), held.bytes_used, held.inodes_used, share) for uid, held in owners.items()]
    return sorted(found, key=lambda m: (-m.bytes_used, -m.inodes_used, m.uid))


def member_route(volume_key: str) -> str:
    return f"DELETE /v1/admin/disk/volumes/{volume_key}/members/{{user_id}}"


def shared_no_space_message(original: str, volume: DiskUsage, members: list[MemberUsage], caller: int, *, top: int = 3) -> str:
    """A write into a full shared place failed: who holds it, that the caller cannot delete the
    others' files (the place is sticky), and who can."""
    shown = [m for m in members if m.user_id != caller][:top]
    holders = "; ".join(f"{m.who} holds {m.summary()}" + (" (over its share)" if m.over_share else "") for m in shown)
    mine = next((m for m in members if m.user_id == caller), None)
    own = f" Your own files there take {mine.summary()}." if mine is not None else ""
    return (
        f"{original} (this shared place ({volume.volume}) is full: {volume.summary()} used. "
        f"{holders or 'No other member holds files there'}.{own} You cannot delete other members' files here "
        f"(the directory is sticky); each member can delete its own, and an admin can free a member's files with "
        f"{member_route(volume.volume)}.)"
    )


def over_share_message(volume: str, member: MemberUsage) -> str:
    """A member over its share of a shared place: why its write there is refused."""
    return (
        f"No space for you in this shared place ({volume}): your files there hold {member.summary()}, over the "
        f"{member.share.bytes_limit / MIB:.1f} MiB / {member.share.inodes_limit} files one member may hold. "
        "Delete some of your own files there (the shell still works), or ask an admin "
        f"({member_route(volume)})."
    )
