"""Bodies of the admin's user, run and sandbox routes (docs/admin-console.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from orchestrator.http.models import Body, GroupOut, PersonOut, RunOut


class AdminUserOut(BaseModel):
    user_id: int
    display_name: str | None
    identities: list[PersonOut]
    backend: str = Field(description="The backend its sandbox runs on (its override, else the default).")
    backend_override: str | None
    state: str = Field(description="Its sandbox: running, paused, starting, failed or stopped.")
    groups: list[GroupOut]
    cpus: float
    memory_mb: int
    resources_override: bool = Field(description="Whether CPU and memory are the admin's, not the operator's default.")
    created_at: str


class AdminUsersOut(BaseModel):
    users: list[AdminUserOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last.")


class AdminRunOut(RunOut):
    last_activity_at: str | None
    group: GroupOut | None = Field(None, description="The group chat of the run's session, if any.")


class AdminRunsOut(BaseModel):
    runs: list[AdminRunOut]


class SandboxActionOut(BaseModel):
    user_id: int
    state: str


class ResourcesIn(Body):
    cpus: float | None = Field(..., gt=0, description="CPUs for the user's sandbox; null: the default (ORCH_SANDBOX_CPUS).")
    memory_mb: int | None = Field(
        ..., gt=0, description="Memory (MiB) for the user's sandbox; null: the default (ORCH_SANDBOX_MEMORY_MB)."
    )


class ResourcesOut(BaseModel):
    user_id: int
    cpus: float
    memory_mb: int
    override: bool
    max_cpus: float
    max_memory_mb: int


class PurgeIn(Body):
    confirm_user_id: int = Field(..., gt=0, description="The same user id again: a purge cannot be undone.")


class PurgeOut(BaseModel):
    user_id: int
    purged: bool
    already_purged: bool = Field(description="A repeated purge (it finished what the first left).")
    sessions_deleted: list[str]
    volume_removed: bool
    entries_removed: int
