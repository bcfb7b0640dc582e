"""The sandbox lifecycle interface, kept as small as JupyterHub's spawners: a backend knows
*where* a user's sandbox runs and hands out its live agent; *what* can be done in it is the
sandbox agent's wire API (`sandbox_agent.wire`), and how one call goes (counting, the one
retry, error wording) is `SandboxCaller`'s (`orchestrator/sandboxes/calling.py`). See
docs/backends.md."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from mounts.plan import MountPlan
from sandbox_agent.client import AgentClient, AsyncAgentClient


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


def reap_interval_s(idle_timeout_s: float) -> float:
    """How often a backend's idle sandboxes are looked for: a quarter of the idle timeout, so
    one is stopped at most a quarter late, within [0.05, 5] s."""
    return min(max(idle_timeout_s / 4, 0.05), 5.0)


class CallCount:
    """The calls in flight on one agent and when it was last used. The router counts
    (`calling`); the backend reads it to decide whether an agent is idle (reaping, restarts
    that wait until no call runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.last_used = time.monotonic()

    @contextmanager
    def calling(self) -> Iterator[None]:
        with self._lock:
            self.in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1
                self.last_used = time.monotonic()

    def touch(self) -> None:
        with self._lock:
            self.last_used = time.monotonic()


@dataclass(frozen=True, eq=False)
class LiveAgent:
    """One user's live agent as a backend hands it out: both clients of its socket (the
    blocking one for worker threads, the async one for the event loop) and its call count.
    Compared by identity: `forget` drops exactly the agent a call failed on."""

    user_id: int
    blocking: AgentClient
    calls: AsyncAgentClient
    count: CallCount = field(default_factory=CallCount)


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

    def status(self) -> list[SandboxStatus]:
        """Every sandbox this backend knows about."""

    def reap_idle(self, now: float | None = None) -> list[int]:
        """Stop the sandboxes idle (no call in flight) for longer than the idle timeout, as of
        `now` (monotonic; default: now); returns their users. The composition root runs it
        as a `PeriodicTask` every `reap_interval_s`."""

    def close(self) -> None:
        """Release resources at orchestrator shutdown (sandboxes may keep running)."""

