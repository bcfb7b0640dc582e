"""Admin routes of disk quotas: usage of every volume, one user's, growing a user's limit, and
each member's files in a shared place (listed, and freed)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path

from orchestrator.http.auth import Caller, require_admin
from orchestrator.http.disk_models import (
    DiskLimitIn,
    DiskOverviewOut,
    DiskUsageOut,
    GroupChatOut,
    HostCopiesOut,
    MemberFreedOut,
    MemberUsageOut,
    SharedMembersOut,
    UserDiskOut,
)
from orchestrator.http.params import user_id_param
from orchestrator.http.parts import disk_quotas_of, host_copies_of
from orchestrator.errors import NotFound
from orchestrator.quotas.host_copies import HostCopies
from orchestrator.quotas.model import DiskUsage
from orchestrator.quotas.service import DiskQuotas, SharedMembers

router = APIRouter()


def _out(quotas: DiskQuotas, usage: DiskUsage) -> DiskUsageOut:
    group = quotas.group_of_volume(usage.volume)
    chat = GroupChatOut(channel=group.channel, chat_id=group.chat_id) if group is not None else None
    return DiskUsageOut(**usage.as_dict(), image_mb=quotas.image_mb(usage.volume), chat=chat)


def _host_copies(host_copies: HostCopies, user_id: int) -> HostCopiesOut:
    used = host_copies.usage(user_id)
    return HostCopiesOut(
        deliveries=used.deliveries, results=used.results, transfers=used.transfers,
        bytes_used=used.total, bytes_limit=host_copies.budget_bytes,
    )  # fmt: skip


@router.get("/v1/admin/disk", response_model=DiskOverviewOut, tags=["admin"])
def get_disk(quotas: DiskQuotas = Depends(disk_quotas_of), _: Caller = Depends(require_admin)) -> DiskOverviewOut:
    health = quotas.health()
    return DiskOverviewOut(
        mechanism=health.mechanism,
        reason=health.reason,
        min_free_disk_pct=health.min_free_disk_pct,
        host_free_pct=health.host_free_pct,
        watermark_problem=health.watermark_problem,
        over_quota_users=list(health.over_quota_users),
        over_share={key: list(users) for key, users in health.over_share.items()},
        volumes=[_out(quotas, usage) for usage in quotas.all_usage()],
    )


@router.get("/v1/admin/users/{user_id}/disk", response_model=UserDiskOut, tags=["admin"])
def get_user_disk(
    user_id: int = Depends(user_id_param),
    quotas: DiskQuotas = Depends(disk_quotas_of),
    host_copies: HostCopies = Depends(host_copies_of),
    _: Caller = Depends(require_admin),
) -> UserDiskOut:
    usage = quotas.usage(user_id)
    return UserDiskOut(
        user_id=user_id,
        mechanism=quotas.mechanism.value,
        usage=_out(quotas, usage) if usage is not None else None,
        host_copies=_host_copies(host_copies, user_id),
    )


@router.put("/v1/admin/users/{user_id}/disk", response_model=UserDiskOut, tags=["admin"])
def put_user_disk(
    body: DiskLimitIn,
    user_id: int = Depends(user_id_param),
    quotas: DiskQuotas = Depends(disk_quotas_of),
    host_copies: HostCopies = Depends(host_copies_of),
    _: Caller = Depends(require_admin),
) -> UserDiskOut:
    usage, online = quotas.set_disk_limit(user_id, body.disk_mb)
    return UserDiskOut(
        user_id=user_id, mechanism=quotas.mechanism.value, usage=_out(quotas, usage),
        host_copies=_host_copies(host_copies, user_id), grown_online=online,
    )  # fmt: skip


VolumeKey = Path(..., max_length=64, description="A shared volume as GET /v1/admin/disk lists it: share, group-...")


def _members_out(quotas: DiskQuotas, found: SharedMembers) -> dict[str, object]:
    return {
        "volume": found.usage.volume,
        "usage": _out(quotas, found.usage),
        "members": [MemberUsageOut(**m.as_dict()) for m in found.members],
        "partial": found.partial,
    }


@router.get("/v1/admin/disk/volumes/{volume}/members", response_model=SharedMembersOut, tags=["admin"])
def get_shared_members(
    volume: str = VolumeKey, quotas: DiskQuotas = Depends(disk_quotas_of), _: Caller = Depends(require_admin)
) -> SharedMembersOut:
    found = quotas.members(quotas.shared_volume(volume))
    if found is None:
        raise NotFound(f"the shared place {volume} is not mounted")
    return SharedMembersOut(**_members_out(quotas, found))


@router.delete("/v1/admin/disk/volumes/{volume}/members/{user_id}", response_model=MemberFreedOut, tags=["admin"])
def delete_shared_member_files(
    volume: str = VolumeKey,
    user_id: int = Depends(user_id_param),
    quotas: DiskQuotas = Depends(disk_quotas_of),
    _: Caller = Depends(require_admin),
) -> MemberFreedOut:
    removal, found = quotas.free_member(quotas.shared_volume(volume), user_id)
    if found is None:
        raise NotFound(f"the shared place {volume} is not mounted")
    return MemberFreedOut(
        **_members_out(quotas, found),
        user_id=user_id,
        removed=removal.removed,
        kept_dirs=removal.kept_dirs,
        complete=removal.complete,
    )
