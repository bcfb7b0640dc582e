"""The sandbox lifecycle interface, kept as small as JupyterHub's spawners: a backend knows
*where* a user's sandbox runs and hands out its live agent; *what* can be done in it is the
sandbox agent's wire API (`sandbox_agent.wire`), and how one call goes (counting, the one
retry, error wording) is `SandboxCaller`'s (`orchestrator/sandboxes/calling.py`). See
docs/backends.md."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from mounts.plan import MountPlan
from orchestrator.call_ledger import SandboxEntry
from sandbox_agent.client import AgentClient, AsyncAgentClient
from sandbox_agent.errors import AgentUnavailable

PROCESS_HEALTH_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class SandboxTemplate:
    """A template a user's sandbox runs instead of the default image (docs/templates.md): the
    image (its content-hash tag) and the variables its recipe sets for the shells."""

    name: str
    image: str
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SandboxUser:
    """What a backend needs to run one user's sandbox: the user, their current plan, the
    template when not the default image, and the name git commits carry."""

    user_id: int
    plan: MountPlan
    # The admin's per-user override (orchestrator/users/resources.py); None: the operator's default.
    cpus: float | None = None
    memory_mb: int | None = None
    template: SandboxTemplate | None = None
    display_name: str | None = None


def image_of(user: SandboxUser, default_image: str) -> str:
    """The image the user's sandbox runs: its template's (by content-hash tag), else the default."""
    return user.template.image if user.template is not None else default_image


@dataclass(frozen=True)
class SandboxStatus:
    user_id: int
    backend: str
    state: str  # running | paused | stopped | starting | failed
    plan_hash: str | None = None
    agent_build: str | None = None
    busy: int = 0
    detail: dict[str, Any] | None = None
    since: str | None = None  # when the sandbox (agent or container) started, ISO 8601 UTC




@dataclass(frozen=True, eq=False)
class LiveAgent:
    """One user's live agent as a backend hands it out: both faces of its client (the blocking
    façade for worker threads, its async transport for the event loop) and its sandbox's entry
    in the call ledger (its calls in flight, pause, processes).
    Compared by identity: `forget` drops exactly the agent a call failed on."""

    user_id: int
    blocking: AgentClient
    calls: AsyncAgentClient
    count: SandboxEntry = field(default_factory=SandboxEntry)


class SandboxBackend(Protocol):
    """Where users' sandboxes run. Every method may be called from any thread; none but
    `warm` needs to be quick."""

    name: str

    def warm(self, user: SandboxUser) -> LiveAgent | None:
        """The user's agent when it can take a call as it is: never waits for a lock, never
        starts or inspects anything (the router's event-loop path). None sends the caller to
        `ensure`."""

    def ensure(self, user: SandboxUser) -> LiveAgent:
        """Start (or adopt, or recreate) the user's sandbox and wait until its agent answers;
        raises `ToolError` (`sandbox_unavailable`, the tool did not run) when it cannot."""

    def resume(self, user: SandboxUser) -> LiveAgent | None:
        """When the user's sandbox is paused (frozen by the reaper): thaw it and return its
        agent, ready for the call; None when it is not paused (the caller goes to `ensure`).
        Worker thread: it may call the engine."""

    def forget(self, user_id: int, *, agent: LiveAgent | None = None, stalled: bool = False) -> None:
        """Never hand out this agent again (given: only if it is still the user's current
        one): the next `ensure` starts afresh. `stalled` = it missed a deadline (stopped,
        paused, hung): it is killed rather than asked to stop. Quick: no start, no wait."""

    def cancel_calls(self, user_id: int, *, run_id: str | None = None, session_id: str | None = None) -> int:
        """Kill the user's calls in flight for this run or session (whole process trees) and
        return how many there were once they ended; 0 when the user has no live sandbox
        (never starts one)."""

    def stop(self, user_id: int) -> None:
        """Stop the user's sandbox; the next call starts it again."""

    def pause(self, user_id: int) -> bool:
        """Freeze the user's running sandbox now (as the reaper does when it is idle); False
        when none runs, a call is in flight, or the backend cannot pause. The next call
        resumes it."""

    def status(self) -> list[SandboxStatus]:
        """Every sandbox this backend knows about."""

    def reap_idle(self, now: float | None = None) -> list[int]:
        """Apply `idle_action` to every sandbox as of `now` (monotonic; default: now): pause
        the ones idle for the pause time, stop the ones idle for the idle timeout; returns the
        users stopped. The composition root runs it as a `PeriodicTask` every
        `reap_interval_s`."""

    def close(self) -> None:
        """Release resources at orchestrator shutdown (sandboxes may keep running)."""



def runs_processes(live: LiveAgent | None, count: SandboxEntry) -> bool:
    """Whether the sandbox runs background processes, so an idle stop must spare it: the one
    way the orchestrator knows (docs/processes.md). The count every process_* answer carries
    is kept on the agent's `SandboxEntry`; a count that is not zero (or not known) is refreshed
    from the agent's `/health` (`processes`), since a process may have ended unseen."""
    if count.processes == 0 or time.monotonic() > count.processes_until:
        return False  # none, or none can still run whatever the sandbox says
    if live is None:
        return True  # not known, and no agent to ask: keep it
    try:
        health = live.blocking.health(timeout_s=PROCESS_HEALTH_TIMEOUT_S)
    except AgentUnavailable:
        return False  # an agent that does not answer keeps nothing running worth sparing
    count.note_processes(health.processes)
    return health.processes > 0
