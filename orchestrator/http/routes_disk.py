"""Admin routes of disk quotas: usage of every volume, one user's, and growing a user's limit."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from orchestrator.http.auth import Caller, require_admin, service_of
from orchestrator.http.disk_models import DiskLimitIn, DiskOverviewOut, DiskUsageOut, UserDiskOut
from orchestrator.http.params import user_id_param
from orchestrator.quotas.model import DiskUsage
from orchestrator.service import OrchestratorService

router = APIRouter()


def _out(service: OrchestratorService, usage: DiskUsage) -> DiskUsageOut:
    return DiskUsageOut(**usage.as_dict(), image_mb=service.disk_quotas.image_mb(usage.volume))


@router.get("/v1/admin/disk", response_model=DiskOverviewOut, tags=["admin"])
def get_disk(service: OrchestratorService = Depends(service_of), _: Caller = Depends(require_admin)) -> DiskOverviewOut:
    quotas = service.disk_quotas
    health = quotas.health()
    return DiskOverviewOut(
        mechanism=health.mechanism,
        reason=health.reason,
        min_free_disk_pct=health.min_free_disk_pct,
        host_free_pct=health.host_free_pct,
        watermark_problem=health.watermark_problem,
        over_quota_users=list(health.over_quota_users),
        volumes=[_out(service, usage) for usage in quotas.all_usage()],
    )


@router.get("/v1/admin/users/{user_id}/disk", response_model=UserDiskOut, tags=["admin"])
def get_user_disk(
    user_id: int = Depends(user_id_param),
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_admin),
) -> UserDiskOut:
    usage = service.disk_quotas.usage(user_id)
    return UserDiskOut(
        user_id=user_id,
        mechanism=service.disk_quotas.mechanism.value,
        usage=_out(service, usage) if usage is not None else None,
    )


@router.put("/v1/admin/users/{user_id}/disk", response_model=UserDiskOut, tags=["admin"])
def put_user_disk(
    body: DiskLimitIn,
    user_id: int = Depends(user_id_param),
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_admin),
) -> UserDiskOut:
    usage, online = service.disk_quotas.set_disk_limit(user_id, body.disk_mb)
    return UserDiskOut(
        user_id=user_id, mechanism=service.disk_quotas.mechanism.value, usage=_out(service, usage), grown_online=online
    )
