"""Bodies of the admin disk-quota routes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DiskLimitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    disk_mb: int = Field(..., ge=8, le=16 * 1024 * 1024, description="The user's new disk quota (MiB); only growth.")


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


class UserDiskOut(BaseModel):
    user_id: int
    mechanism: str
    usage: DiskUsageOut | None = Field(None, description="None until the user's image exists (or a scan counted it).")
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
    volumes: list[DiskUsageOut]
