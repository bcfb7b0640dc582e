"""The admin's users, runs and sandboxes (docs/admin-console.md): list users and runs, stop /
restart / pause / resume one user's sandbox, set its CPU and memory, purge a user."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query

from mounts import ids
from orchestrator.http.admin_models import (
    AdminRunOut,
    AdminRunsOut,
    AdminUserOut,
    AdminUsersOut,
    PurgeIn,
    PurgeOut,
    ResourcesIn,
    ResourcesOut,
    SandboxActionOut,
)
from orchestrator.http.auth import Caller, require_admin
from orchestrator.http.models import GroupOut, PersonOut
from orchestrator.http.params import purged_or_live_user_id_param, user_id_param
from orchestrator.http.parts import (
    Records,
    purge_of,
    records_of,
    resources_of,
    sandbox_control_of,
    user_listing_of,
    users_of,
)
from orchestrator.runs.listing import ListedRun, run_filter
from orchestrator.users.listing import UserFilter, UserListing, UserSummary, parse_cursor
from orchestrator.users.purge import UserPurge
from orchestrator.users.repository import UserRepository
from orchestrator.users.resources import ResourceOverrides
from orchestrator.users.sandbox_control import SandboxAction, SandboxControl

router = APIRouter()


def user_out(overrides: ResourceOverrides, summary: UserSummary) -> AdminUserOut:
    resources = overrides.of(summary.user_id)
    return AdminUserOut(
        user_id=summary.user_id,
        display_name=summary.display_name,
        identities=[PersonOut(platform=i.platform, id=i.external_id) for i in summary.identities],
        backend=summary.backend,
        backend_override=summary.backend_override,
        state=summary.state,
        groups=[GroupOut(channel=g.channel, chat_id=g.chat_id) for g in summary.groups],
        cpus=resources.cpus,
        memory_mb=resources.memory_mb,
        resources_override=overrides.has_override(summary.user_id),
        created_at=summary.created_at,
    )


def run_out(listed: ListedRun) -> AdminRunOut:
    run = listed.run
    group = GroupOut(channel=listed.group.channel, chat_id=listed.group.chat_id) if listed.group else None
    return AdminRunOut(
        run_id=run.run_id, session_id=run.session_id, trigger=run.trigger, owner_user_id=run.owner_user_id,
        execution_user_id=run.execution_user_id, runtime_user_id=run.runtime_user_id,
        identity_mode=run.identity_mode, status=run.status, started_at=run.started_at, ended_at=run.ended_at,
        last_activity_at=listed.last_activity_at, group=group,
    )  # fmt: skip


@router.get("/v1/admin/users", response_model=AdminUsersOut, tags=["admin"])
def get_users(
    platform: str | None = Query(None, max_length=32, description="Only users with an identity on this platform."),
    backend: str | None = Query(None, max_length=32, description="Only users whose sandbox runs on this backend."),
    state: str | None = Query(None, max_length=16, description="Only users whose sandbox is in this state (stopped: none runs)."),
    cursor: str | None = Query(None, max_length=20),
    limit: int = Query(50, ge=1, le=500),
    user_listing: UserListing = Depends(user_listing_of),
    resources: ResourceOverrides = Depends(resources_of),
    _: Caller = Depends(require_admin),
) -> AdminUsersOut:
    found, next_after = user_listing.page(
        UserFilter(platform=platform or None, backend=backend or None, state=state or None),
        after=parse_cursor(cursor),
        limit=limit,
    )
    return AdminUsersOut(
        users=[user_out(resources, s) for s in found], next_cursor=str(next_after) if next_after is not None else None
    )


@router.get("/v1/admin/runs", response_model=AdminRunsOut, tags=["admin"])
def get_runs(
    state: Literal["active", "recent"] = Query("recent", description="`active`: still running; `recent`: any, newest first."),
    user_id: int | None = Query(None, ge=1, le=ids.MAX_USER_ID, description="As owner, execution or runtime user."),
    session_id: str | None = Query(None, max_length=128),
    channel: str | None = Query(None, max_length=64, description="With chat_id: the runs of one group chat."),
    chat_id: str | None = Query(None, max_length=128),
    limit: int = Query(100, ge=1, le=1000),
    records: Records = Depends(records_of),
    _: Caller = Depends(require_admin),
) -> AdminRunsOut:
    wanted = run_filter(state, user_id, session_id, channel, chat_id)
    return AdminRunsOut(runs=[run_out(r) for r in records.runs(wanted, limit=limit)])


@router.post("/v1/admin/users/{user_id}/sandbox/{action}", response_model=SandboxActionOut, tags=["admin"])
def post_sandbox_action(
    action: SandboxAction,
    user_id: int = Depends(user_id_param),
    sandbox_control: SandboxControl = Depends(sandbox_control_of),
    caller: Caller = Depends(require_admin),
) -> SandboxActionOut:
    """Stop, restart, pause or resume the user's sandbox (a pause or resume that cannot be done
    now is a 409); audited as `sandbox.{action}`."""
    return SandboxActionOut(user_id=user_id, state=sandbox_control.act(user_id, action, actor=caller.actor))


def resources_out(overrides: ResourceOverrides, user_id: int) -> ResourcesOut:
    resources = overrides.of(user_id)
    return ResourcesOut(
        user_id=user_id, cpus=resources.cpus, memory_mb=resources.memory_mb,
        override=overrides.has_override(user_id),
        max_cpus=overrides.maxima.cpus, max_memory_mb=overrides.maxima.memory_mb,
    )  # fmt: skip


@router.get("/v1/admin/users/{user_id}/resources", response_model=ResourcesOut, tags=["admin"])
def get_resources(
    user_id: int = Depends(user_id_param),
    resources: ResourceOverrides = Depends(resources_of),
    _: Caller = Depends(require_admin),
) -> ResourcesOut:
    return resources_out(resources, user_id)


@router.put("/v1/admin/users/{user_id}/resources", response_model=ResourcesOut, tags=["admin"])
def put_resources(
    body: ResourcesIn,
    user_id: int = Depends(user_id_param),
    users: UserRepository = Depends(users_of),
    resources: ResourceOverrides = Depends(resources_of),
    caller: Caller = Depends(require_admin),
) -> ResourcesOut:
    """The user's CPU and memory, within ORCH_USER_MAX_CPUS and ORCH_USER_MAX_MEMORY_MB (both
    null: back to the defaults); from the sandbox's next start (restart it to apply now)."""
    users.admit(user_id)
    resources.put(user_id, cpus=body.cpus, memory_mb=body.memory_mb, actor=caller.actor)
    return resources_out(resources, user_id)


@router.delete("/v1/admin/users/{user_id}", response_model=PurgeOut, tags=["admin"])
def delete_user(
    body: PurgeIn,
    user_id: int = Depends(purged_or_live_user_id_param),
    purge: UserPurge = Depends(purge_of),
    caller: Caller = Depends(require_admin),
) -> PurgeOut:
    """Purge the user: its sandbox, files, disk image, sessions, personal skills, previews and
    identities go; its id answers `410 user_purged` from then on and is never used again.
    Needs `{"confirm_user_id": uid}`. Repeating it finishes a purge cut short."""
    report = purge.purge(user_id, confirm_user_id=body.confirm_user_id, actor=caller.actor)
    return PurgeOut(
        user_id=user_id, purged=True, already_purged=report.already_purged, sessions_deleted=report.sessions_deleted,
        volume_removed=report.volume_removed, entries_removed=report.entries_removed,
    )  # fmt: skip
