"""Bodies of the admin disk-quota routes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DiskLimitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    disk_mb: int = Field(..., ge=8, le=16 * 1024 * 1024, description="The user's new disk quota (MiB); only growth.")


class GroupChatOut(BaseModel):
    channel: str
    chat_id: str


class DiskUsageOut(BaseModel):
    volume: str
    mechanism: str
    bytes_used: int
    bytes_limit: int
    inodes_used: int
    inodes_limit: int
    over_quota: bool
    partial: bool
    image_mb: int | None = Field(None, description="The image's size (loop): the quota as configured.")
    chat: GroupChatOut | None = Field(None, description="For a `group-...` volume: the group chat whose workspace it is.")


class HostCopiesOut(BaseModel):
    """The user's host-side copies (outside its quota) against ORCH_USER_HOST_COPIES_MB."""

    deliveries: int = Field(..., description="Bytes of outgoing deliveries in outbox/.")
    results: int = Field(..., description="Bytes of results recorded for tool_call_id repeats.")
    transfers: int = Field(..., description="Bytes of transfers in flight (spool files).")
    bytes_used: int
    bytes_limit: int


class UserDiskOut(BaseModel):
    user_id: int
    mechanism: str
    usage: DiskUsageOut | None = Field(None, description="None until the user's image exists (or a scan counted it).")
    host_copies: HostCopiesOut
    grown_online: bool | None = Field(
        None,
        description="After a change: true when the image grew under the running sandbox; false when the host "
        "lacks CAP_SYS_RESOURCE, so the sandbox was stopped for an offline resize (the next call starts it).",
    )


class DiskOverviewOut(BaseModel):
    """The mechanism in force, the host watermark and every volume's usage."""

    mechanism: str
    reason: str
    min_free_disk_pct: float
    host_free_pct: float
    watermark_problem: str | None
    over_quota_users: list[int]
    over_share: dict[str, list[int]] = Field(description="Shared volume -> the members over their share there.")
    volumes: list[DiskUsageOut]


class MemberUsageOut(BaseModel):
    user_id: int | None = Field(description="The member whose sandbox owns these files (None: another owner, e.g. root).")
    uid: int
    bytes_used: int
    inodes_used: int
    share_bytes: int = Field(description="How much one member may hold here (ORCH_SHARED_MEMBER_SHARE_PCT).")
    share_inodes: int
    over_share: bool


class SharedMembersOut(BaseModel):
    """A shared place (share/ or a group workspace): its usage and each member's files in it."""

    volume: str
    usage: DiskUsageOut
    members: list[MemberUsageOut] = Field(description="The largest holder first.")
    partial: bool = Field(description="The walk stopped at its bound (the place's inode quota): lower bounds.")


class MemberFreedOut(SharedMembersOut):
    user_id: int
    removed: int = Field(description="The member's entries removed (files, links, directories).")
    kept_dirs: int = Field(description="The member's directories kept: they still hold other members' files.")
    complete: bool = Field(description="False: the removal stopped at its bound; call again.")
