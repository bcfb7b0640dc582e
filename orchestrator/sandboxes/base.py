"""The sandbox lifecycle interface, kept as small as JupyterHub's spawners.

A backend knows *where* a user's sandbox runs; *what* can be done in it is the sandbox
agent's wire API (`sandbox_agent.wire`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from mounts.plan import MountPlan
from sandbox_agent.wire import CallContext


@dataclass(frozen=True)
class SandboxUser:
    """What a backend needs to run one user's sandbox: the user and their current plan."""

    user_id: int
    plan: MountPlan


@dataclass(frozen=True)
class SandboxStatus:
    user_id: int
    backend: str
    state: str  # running | stopped | starting | failed
    plan_hash: str | None = None
    agent_build: str | None = None
    busy: int = 0
    detail: dict[str, Any] | None = None
    since: str | None = None  # when the sandbox (agent or container) started, ISO 8601 UTC


def loses_group_access(running_gids: Iterable[int], planned_gids: Iterable[int]) -> bool:
    """Pure: whether the sandbox now running carries a group gid (and so a workspace) the plan
    no longer gives it: a revoked membership. Such a sandbox is replaced before the next call
    even while it is busy; other plan changes wait until it is idle."""
    return not set(running_gids) <= set(planned_gids)


class ContainerBackend(Protocol):
    name: str

    def ensure(self, user: SandboxUser) -> SandboxStatus:
        """Start (or adopt, or recreate) the user's sandbox and wait until its agent answers."""

    async def call(
        self, user: SandboxUser, tool: str, arguments: dict[str, Any], *, cwd: str, context: CallContext | None = None
    ) -> Any:
        """Run one tool in the user's sandbox, on the event loop and within the call's deadline
        (no thread is held while the agent works); raises `ToolError` for tool-level failures."""

    def call_blocking(
        self, user: SandboxUser, tool: str, arguments: dict[str, Any], *, cwd: str, context: CallContext | None = None
    ) -> Any:
        """`call` for code that runs in a worker thread anyway (host tools), with the same
        deadline and failure handling, on the agent's blocking client."""

    def cancel_calls(self, user_id: int, *, run_id: str | None = None, session_id: str | None = None) -> int:
        """Kill the user's calls in flight for this run or session (whole process trees) and
        return how many there were once they ended; 0 when the user has no live sandbox
        (never starts one)."""

    def stop(self, user_id: int) -> None:
        """Stop the user's sandbox; the next call starts it again."""

    def status(self) -> list[SandboxStatus]:
        """Every sandbox this backend knows about."""

    def close(self) -> None:
        """Release resources at orchestrator shutdown (sandboxes may keep running)."""
