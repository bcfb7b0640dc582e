"""What a route may depend on: one narrow part of the service each, never the service whole.

A route names the parts it uses as dependencies (`sessions: SessionService = Depends(sessions_of)`);
`create_app` builds `ApiParts` once from the service, and each `*_of` function below hands a route
one field of it. So what the HTTP layer (and the console) can reach is this one list, each part
typed, and a route's signature says which parts of the orchestrator it touches. The settings a
route reads arrive as their section (`ApiSettings`, `CredentialSettings`), built once here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fastapi import Request

from mounts.layout import DataLayout
from orchestrator import audit
from orchestrator.audit import AuditEntry, AuditFilter
from orchestrator.runs.listing import ListedRun, RunFilter, list_runs, tool_calls_of
from orchestrator.state_store import StateStore
from orchestrator.users.listing import GroupSummary, list_groups

if TYPE_CHECKING:
    from orchestrator.collaboration.coordinator import CollaborationService
    from orchestrator.credentials.store import CredentialStore
    from orchestrator.deliveries.outbox import DeliveryStore
    from orchestrator.deliveries.public_uploads import PublishedUploads
    from orchestrator.descriptors.budget import DescriptorBudget
    from orchestrator.egress.service import EgressService
    from orchestrator.previews.service import PreviewService
    from orchestrator.quotas.host_copies import HostCopies
    from orchestrator.quotas.service import DiskQuotas
    from orchestrator.runs.identity_switch import RuntimeIdentitySwitch
    from orchestrator.runs.records import RunRepository
    from orchestrator.runs.service import RunService
    from orchestrator.sandboxes.router import SandboxRouter
    from orchestrator.service import OrchestratorService
    from orchestrator.sessions.projects import ProjectRepository
    from orchestrator.sessions.records import SessionRepository
    from orchestrator.sessions.service import SessionService
    from orchestrator.settings import ApiSettings, CredentialSettings, Settings
    from orchestrator.skills.admin import SkillAdmin
    from orchestrator.system_status import SystemStatus
    from orchestrator.templates.service import TemplateService
    from orchestrator.tools.dispatch import ToolDispatcher
    from orchestrator.tools.registry import ToolRegistry
    from orchestrator.users.identities import IdentityRepository
    from orchestrator.users.incoming import IncomingFiles
    from orchestrator.users.listing import UserListing
    from orchestrator.users.purge import UserPurge
    from orchestrator.users.repository import UserRepository
    from orchestrator.users.resources import ResourceOverrides
    from orchestrator.users.sandbox_control import SandboxControl


class Records:
    """The admin's read-only views of what the state database recorded: the audit log, runs,
    a run's tool calls, the groups. Reads only; a route never gets the store itself."""

    def __init__(self, store: StateStore, layout: DataLayout) -> None:
        self._store = store
        self.layout = layout  # where a group's volume is keyed (the console's group list)

    def audit(self, *, where: AuditFilter | None = None, action: str | None = None, limit: int) -> list[AuditEntry]:
        return audit.entries(self._store, where=where, action=action, limit=limit)

    def runs(self, wanted: RunFilter, *, limit: int) -> list[ListedRun]:
        return list_runs(self._store, wanted, limit=limit)

    def tool_calls(self, run_id: str) -> list[AuditEntry]:
        return tool_calls_of(self._store, run_id)

    def groups(self) -> list[GroupSummary]:
        return list_groups(self._store)


class ConsoleLogins:
    """The admin console's one write of its own: the audit row of each login (the console's
    other changes are the services' calls, which write their own rows). A route gets this,
    never the store."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def record(self, *, actor: str) -> None:
        with self._store.write() as tx:
            audit.record(tx, actor=actor, action="console.login")


@dataclass(frozen=True)
class ApiParts:
    """Every part of the service a route or the console may use, and the settings sections
    they read. Built once, when the app is (`ApiParts.of`)."""

    status: SystemStatus
    user_listing: UserListing
    users: UserRepository
    identities: IdentityRepository
    projects: ProjectRepository
    sessions: SessionService
    session_repo: SessionRepository
    runs: RunService
    run_repo: RunRepository
    switch: RuntimeIdentitySwitch
    sandboxes: SandboxRouter
    sandbox_control: SandboxControl
    resources: ResourceOverrides
    purge: UserPurge
    templates: TemplateService
    disk_quotas: DiskQuotas
    host_copies: HostCopies
    descriptors: DescriptorBudget
    deliveries: DeliveryStore
    uploads: PublishedUploads
    incoming: IncomingFiles
    skill_admin: SkillAdmin
    tools: ToolRegistry
    dispatcher: ToolDispatcher
    collaboration: CollaborationService
    egress: EgressService | None
    credentials: CredentialStore | None
    previews: PreviewService | None
    records: Records
    api: ApiSettings
    credential_settings: CredentialSettings
    console_logins: ConsoleLogins

    @classmethod
    def of(cls, service: OrchestratorService) -> ApiParts:
        from orchestrator.settings import ApiSettings, CredentialSettings

        settings: Settings = service.settings
        return cls(
            status=service.status,
            user_listing=service.user_listing,
            users=service.users,
            identities=service.identities,
            projects=service.projects,
            sessions=service.sessions,
            session_repo=service.session_repo,
            runs=service.runs,
            run_repo=service.run_repo,
            switch=service.switch,
            sandboxes=service.sandboxes,
            sandbox_control=service.sandbox_control,
            resources=service.resources,
            purge=service.purge,
            templates=service.templates,
            disk_quotas=service.disk_quotas,
            host_copies=service.host_copies,
            descriptors=service.descriptors,
            deliveries=service.deliveries,
            uploads=service.uploads,
            incoming=service.incoming,
            skill_admin=service.skill_admin,
            tools=service.tools,
            dispatcher=service.dispatcher,
            collaboration=service.collaboration,
            egress=service.egress,
            credentials=service.credentials,
            previews=service.previews,
            records=Records(service.store, service.layout),
            api=ApiSettings.of(settings),
            credential_settings=CredentialSettings.of(settings),
            console_logins=ConsoleLogins(service.store),
        )


def parts_of(request: Request) -> ApiParts:
    return request.app.state.parts


# One dependency per part: a route's signature names exactly what it uses.


async def system_status_of(request: Request) -> SystemStatus:
    return parts_of(request).status


async def user_listing_of(request: Request) -> UserListing:
    return parts_of(request).user_listing


async def users_of(request: Request) -> UserRepository:
    return parts_of(request).users


async def identities_of(request: Request) -> IdentityRepository:
    return parts_of(request).identities


async def projects_of(request: Request) -> ProjectRepository:
    return parts_of(request).projects


async def sessions_of(request: Request) -> SessionService:
    return parts_of(request).sessions


async def session_repo_of(request: Request) -> SessionRepository:
    return parts_of(request).session_repo


async def runs_of(request: Request) -> RunService:
    return parts_of(request).runs


async def run_repo_of(request: Request) -> RunRepository:
    return parts_of(request).run_repo


async def switch_of(request: Request) -> RuntimeIdentitySwitch:
    return parts_of(request).switch


async def sandboxes_of(request: Request) -> SandboxRouter:
    return parts_of(request).sandboxes


async def sandbox_control_of(request: Request) -> SandboxControl:
    return parts_of(request).sandbox_control


async def resources_of(request: Request) -> ResourceOverrides:
    return parts_of(request).resources


async def purge_of(request: Request) -> UserPurge:
    return parts_of(request).purge


async def templates_of(request: Request) -> TemplateService:
    return parts_of(request).templates


async def disk_quotas_of(request: Request) -> DiskQuotas:
    return parts_of(request).disk_quotas


async def host_copies_of(request: Request) -> HostCopies:
    return parts_of(request).host_copies


async def deliveries_of(request: Request) -> DeliveryStore:
    return parts_of(request).deliveries


async def uploads_of(request: Request) -> PublishedUploads:
    return parts_of(request).uploads


async def incoming_of(request: Request) -> IncomingFiles:
    return parts_of(request).incoming


async def skill_admin_of(request: Request) -> SkillAdmin:
    return parts_of(request).skill_admin


async def tools_of(request: Request) -> ToolRegistry:
    return parts_of(request).tools


async def collaboration_of(request: Request) -> CollaborationService:
    return parts_of(request).collaboration


async def egress_of(request: Request) -> EgressService | None:
    return parts_of(request).egress


async def credentials_of(request: Request) -> CredentialStore | None:
    return parts_of(request).credentials


async def previews_of(request: Request) -> PreviewService | None:
    return parts_of(request).previews


async def records_of(request: Request) -> Records:
    return parts_of(request).records


async def credential_settings_of(request: Request) -> CredentialSettings:
    return parts_of(request).credential_settings


async def api_settings_of(request: Request) -> ApiSettings:
    return parts_of(request).api


async def console_logins_of(request: Request) -> ConsoleLogins:
    return parts_of(request).console_logins


# Typed views for a route that uses several parts together (whose run it is; a tool call's
# answer): their getters hand out `ApiParts` seen through the view, no new object.


class RunReach(Protocol):
    """The runs and the sessions they belong to: what says which runs a person reaches
    (orchestrator/http/acting.py)."""

    @property
    def runs(self) -> RunService: ...

    @property
    def sessions(self) -> SessionService: ...


class ToolCallParts(RunReach, Protocol):
    """What answering a tool call uses: whose run it is, the dispatcher, and the descriptor
    budget a streamed answer holds (orchestrator/http/stream_descriptors.py)."""

    @property
    def dispatcher(self) -> ToolDispatcher: ...

    @property
    def descriptors(self) -> DescriptorBudget: ...


async def run_reach_of(request: Request) -> RunReach:
    return parts_of(request)


async def tool_call_parts_of(request: Request) -> ToolCallParts:
    return parts_of(request)
