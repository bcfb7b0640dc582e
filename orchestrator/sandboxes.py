"""Routing a user to their sandbox: the backend that runs it and the plan it runs with (the
user's groups, each with its own gid)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import lru_cache
from typing import Any

from mounts.layout import DataLayout, GroupRef
from mounts.plan import MountPlan, plan_mounts
from orchestrator.backends.base import ContainerBackend, SandboxStatus, SandboxUser
from orchestrator.errors import InvalidInput, ToolError
from orchestrator.group_gids import GroupGids, GroupGidsExhausted
from orchestrator.users import UserRepository
from sandbox_agent.wire import CallContext


@lru_cache(maxsize=4096)
def _plan(layout: DataLayout, user_id: int, memberships: tuple[tuple[GroupRef, int], ...]) -> MountPlan:
    # Pure in its arguments, and memberships (with their gids) are read live for every call: a
    # plan cached under old memberships is simply never asked for again (no invalidation to
    # get wrong). Planning and hashing it cost more than that read.
    return plan_mounts(layout, user_id, [group for group, _ in memberships], dict(memberships))


# The isolation order (docs/decisions.md, "Backend overrides and the isolation floor"): a docker
# container (own mount, pid, network and user namespaces) > a process agent in a bwrap mount
# namespace > a plain process agent (only the uid and the PathSandbox).
_ISOLATION = {("docker", "none"): 2, ("docker", "bwrap"): 2, ("process", "bwrap"): 1, ("process", "none"): 0}


def isolation_rank(backend: str, process_sandbox: str) -> int:
    return _ISOLATION.get((backend, process_sandbox), 0)


def effective_backend(override: str | None, default: str, available: Collection[str], *, process_sandbox: str) -> str:
    """The backend a user runs on: its override when that backend is registered and isolates at
    least as much as the operator's default (the floor), else the default. Also applied to
    overrides stored before the floor existed."""
    if override in (None, "auto") or override not in available:
        return default
    if isolation_rank(override, process_sandbox) < isolation_rank(default, process_sandbox):
        return default
    return override


class BelowIsolationFloor(InvalidInput):
    code = "below_isolation_floor"


class SandboxRouter:
    def __init__(
        self,
        layout: DataLayout,
        users: UserRepository,
        group_gids: GroupGids,
        backends: Mapping[str, ContainerBackend],
        default_backend: str,
        *,
        process_sandbox: str = "none",
    ) -> None:
        self._layout = layout
        self._users = users
        self._group_gids = group_gids
        self.backends = dict(backends)
        self.default_backend = default_backend
        self.process_sandbox = process_sandbox

    def sandbox_user(self, user_id: int) -> SandboxUser:
        try:
            groups = self._group_gids.memberships_of(user_id)
        except GroupGidsExhausted as exc:
            raise ToolError(
                "sandbox_unavailable",
                f"The sandbox of user {user_id} cannot be planned ({exc}). The tool did not run; "
                "tell the user the sandbox service needs an operator.",
            ) from exc
        return SandboxUser(user_id, _plan(self._layout, user_id, tuple(groups.items())))

    def backend_name_for(self, user_id: int) -> str:
        user = self._users.get(user_id)
        override = user.backend if user is not None else None
        return effective_backend(override, self.default_backend, self.backends.keys(), process_sandbox=self.process_sandbox)

    def check_override(self, backend: str | None) -> None:
        """Raises `BelowIsolationFloor` for an override that would isolate less than the default."""
        if backend in (None, "auto"):
            return
        if isolation_rank(backend, self.process_sandbox) < isolation_rank(self.default_backend, self.process_sandbox):
            raise BelowIsolationFloor(
                f"backend {backend} isolates less than this server's floor ({self.default_backend}"
                f"{', bwrap' if self.default_backend == 'process' and self.process_sandbox == 'bwrap' else ''}); "
                "the operator's ORCH_BACKEND is the least isolation any user gets",
                field="backend",
                floor=self.default_backend,
            )

    def backend_for(self, user_id: int) -> ContainerBackend:
        name = self.backend_name_for(user_id)
        backend = self.backends.get(name)
        if backend is None:
            raise ToolError(
                "sandbox_unavailable",
                f"No sandbox backend is available for user {user_id} (wanted: {name}). "
                "The tool cannot run now; tell the user the sandbox service is not ready.",
            )
        return backend

    async def call(
        self, user_id: int, tool: str, arguments: dict[str, Any], *, cwd: str, context: CallContext | None = None
    ) -> Any:
        # The user and membership reads are SQLite reads in WAL mode: they never wait for a
        # writer, so they stay on the loop instead of costing a thread hop.
        backend, user = self.backend_for(user_id), self.sandbox_user(user_id)
        return await backend.call(user, tool, arguments, cwd=cwd, context=context)

    def call_blocking(
        self, user_id: int, tool: str, arguments: dict[str, Any], *, cwd: str, context: CallContext | None = None
    ) -> Any:
        """`call` for code running in a worker thread (host tools). It blocks that thread on the
        agent's blocking client instead of hopping back to the loop (`anyio.from_thread`): the
        hop made a 1 MiB send_file 3 ms slower; the deadline and failure handling are the same."""
        backend, user = self.backend_for(user_id), self.sandbox_user(user_id)
        return backend.call_blocking(user, tool, arguments, cwd=cwd, context=context)

    def status(self) -> list[SandboxStatus]:
        return [status for backend in self.backends.values() for status in backend.status()]

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()
