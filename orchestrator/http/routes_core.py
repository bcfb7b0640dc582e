"""Health, users, projects and the admin runtime-identity switch."""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Depends, Header, Query

from orchestrator import audit
from mounts.layout import GroupRef
from orchestrator.errors import Forbidden, NotFound
from orchestrator.http.acting import require_self
from orchestrator.http.auth import Caller, acting_user, optional_caller, require_admin, require_bot
from orchestrator.http.parts import (
    Records,
    identities_of,
    projects_of,
    records_of,
    sandboxes_of,
    switch_of,
    system_status_of,
    templates_of,
    users_of,
)
from orchestrator.http.models import (
    TemplateChoiceOut,
    GroupOut,
    IdentityModeIn,
    IdentityModeOut,
    MemberRemovedOut,
    ProjectSettingsIn,
    ProjectSettingsOut,
    PersonOut,
    UserIn,
    UserOut,
)
from orchestrator.clock import iso
from orchestrator.http.params import SQLITE_INT_MAX, chat_id_param, group_channel_param, project_id_param, user_id_param
from orchestrator.runs.identity_switch import IdentityModeState, RuntimeIdentitySwitch
from orchestrator.sandboxes.router import SandboxRouter
from orchestrator.sessions.projects import ProjectRepository
from orchestrator.system_status import SystemStatus
from orchestrator.templates.service import TemplateService
from orchestrator.users.identities import IdentityRepository
from orchestrator.users.repository import KEEP, Keep, UserRepository

router = APIRouter()


def _mode_out(state: IdentityModeState) -> IdentityModeOut:
    return IdentityModeOut(
        mode=state.mode, source=state.source, changed_at=state.changed_at, invalid_value=state.invalid_value,
        configured_mode=state.configured_mode, configured_source=state.configured_source,
    )


@router.get("/healthz", tags=["health"])
async def healthz(
    status: SystemStatus = Depends(system_status_of),
    caller: Caller | None = Depends(optional_caller),
) -> dict:
    """Up, and the runtime identity mode, for anyone (a load balancer, a bot); what the host
    exposes (isolation, uid block, disk, egress list, descriptors) with the admin token only,
    or with authentication off (docs/operations.md)."""
    # In memory only: answered on the loop, never queued behind the thread pool.
    if caller is None or caller.role not in ("admin", "local"):
        return status.public()
    return status.host()


def _user_out(
    users: UserRepository, identities: IdentityRepository, templates: TemplateService, user_id: int
) -> UserOut:
    record = users.get(user_id)
    groups = [GroupOut(channel=g.channel, chat_id=g.chat_id) for g in users.groups_of(user_id)]
    people = [
        PersonOut(platform=i.platform, id=i.external_id)
        for i in sorted(identities.of_users([user_id]).get(user_id, ()), key=lambda i: i.created_at)
    ]
    return UserOut(
        user_id=user_id,
        display_name=record.display_name if record else None,
        backend=record.backend if record else None,
        groups=groups,
        identities=people,
        template=TemplateChoiceOut.model_validate(templates.effective(user_id), from_attributes=True),
    )


@router.put("/v1/users/{user_id}", response_model=UserOut, tags=["users"])
def put_user(
    body: UserIn,
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    sandboxes: SandboxRouter = Depends(sandboxes_of),
    users: UserRepository = Depends(users_of),
    identities: IdentityRepository = Depends(identities_of),
    templates: TemplateService = Depends(templates_of),
    caller: Caller = Depends(require_bot),
) -> UserOut:
    """A user's display name (bot); its backend override only with the admin token, and never
    below the operator's isolation floor (docs/decisions.md)."""
    require_self(acting, user_id)
    backend: str | None | Keep = KEEP
    if "backend" in body.model_fields_set:
        if caller.role == "bot":
            raise Forbidden("a user's backend override needs the admin token", field="backend")
        sandboxes.check_override(body.backend)
        backend = body.backend
    users.upsert(user_id, display_name=body.display_name, backend=backend)
    return _user_out(users, identities, templates, user_id)


@router.get("/v1/users/{user_id}", response_model=UserOut, tags=["users"])
def get_user(
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    users: UserRepository = Depends(users_of),
    identities: IdentityRepository = Depends(identities_of),
    templates: TemplateService = Depends(templates_of),
    _: Caller = Depends(require_bot),
) -> UserOut:
    require_self(acting, user_id)
    if users.get(user_id) is None:
        raise NotFound(f"user {user_id} not found")
    return _user_out(users, identities, templates, user_id)


@router.delete("/v1/groups/{channel}/{chat_id}/members/{user_id}", response_model=MemberRemovedOut, tags=["users"])
def remove_group_member(
    channel: str = Depends(group_channel_param),
    chat_id: str = Depends(chat_id_param),
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    users: UserRepository = Depends(users_of),
    caller: Caller = Depends(require_bot),
) -> MemberRemovedOut:
    """Revoke a membership (a person may only leave by itself). From the next call on, the
    user's sandbox has neither the group's workspace nor its gid; a call under way on the old
    sandbox is ended with it. 409 while the user owns live sessions of the group."""
    require_self(acting, user_id)
    group = GroupRef(channel, chat_id)
    removed = users.remove_group_member(group, user_id, actor=caller.actor)
    return MemberRemovedOut(channel=channel, chat_id=chat_id, user_id=user_id, removed=removed)


@router.put("/v1/projects/{project_id}/settings", response_model=ProjectSettingsOut, tags=["projects"])
def put_project_settings(
    body: ProjectSettingsIn,
    project_id: str = Depends(project_id_param),
    projects: ProjectRepository = Depends(projects_of),
    _: Caller = Depends(require_bot),
) -> ProjectSettingsOut:
    settings = projects.update(
        project_id,
        cross_session_read=body.cross_session_read,
        cross_project_collaboration=body.cross_project_collaboration,
    )
    return ProjectSettingsOut.model_validate(settings)


@router.get("/v1/projects/{project_id}/settings", response_model=ProjectSettingsOut, tags=["projects"])
def get_project_settings(
    project_id: str = Depends(project_id_param),
    projects: ProjectRepository = Depends(projects_of),
    _: Caller = Depends(require_bot),
) -> ProjectSettingsOut:
    return ProjectSettingsOut.model_validate(projects.get(project_id))


@router.get("/v1/admin/runtime-identity", response_model=IdentityModeOut, tags=["admin"])
def get_runtime_identity(
    switch: RuntimeIdentitySwitch = Depends(switch_of), _: Caller = Depends(require_admin)
) -> IdentityModeOut:
    return _mode_out(switch.state())


@router.put("/v1/admin/runtime-identity", response_model=IdentityModeOut, tags=["admin"])
def put_runtime_identity(
    body: IdentityModeIn,
    switch: RuntimeIdentitySwitch = Depends(switch_of),
    caller: Caller = Depends(require_admin),
) -> IdentityModeOut:
    return _mode_out(switch.set_by_admin(body.mode, actor=caller.actor))


def audit_filter(
    action: str | None = Query(None, max_length=100),
    session_id: str | None = Query(None, max_length=200),
    user_id: int | None = Query(None, ge=1, le=SQLITE_INT_MAX, description="As the owner or the runtime user."),
    run_id: str | None = Query(None, max_length=128, description="A run's tool calls."),
    tool: str | None = Query(None, max_length=64, description="A tool call's tool."),
    outcome: str | None = Query(None, max_length=64, description="A tool call's outcome: ok, started, or an error code."),
    since: datetime | None = Query(None, description="From this time on (ISO 8601)."),
    until: datetime | None = Query(None, description="Before this time (ISO 8601)."),
    before: int | None = Query(None, ge=1, le=SQLITE_INT_MAX, description="Entries older than this id (the next page)."),
) -> audit.AuditFilter:
    """The audit filters of GET /v1/admin/audit and the console's audit page (a time without
    a zone is UTC)."""
    def moment(value: datetime | None) -> str | None:
        if value is None:
            return None
        return iso(value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc))

    return audit.AuditFilter(
        action=action or None, session_id=session_id or None, user_id=user_id, run_id=run_id or None,
        tool=tool or None, outcome=outcome or None, since=moment(since), until=moment(until), before=before,
    )  # fmt: skip


@router.get("/v1/admin/audit", tags=["admin"])
def get_audit(
    where: audit.AuditFilter = Depends(audit_filter),
    limit: int = Query(100, ge=1, le=1000),
    records: Records = Depends(records_of),
    _: Caller = Depends(require_admin),
) -> dict:
    entries = records.audit(where=where, limit=limit)
    return {"entries": [entry.__dict__ for entry in entries]}


@router.get("/v1/admin/sandboxes", tags=["admin"])
def get_sandboxes(sandboxes: SandboxRouter = Depends(sandboxes_of), _: Caller = Depends(require_admin)) -> dict:
    return {
        "default_backend": sandboxes.default_backend,
        "sandboxes": [status.__dict__ for status in sandboxes.status()],
    }
