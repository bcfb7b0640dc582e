"""What a platform must do for the lifecycle engine (`lifecycle_engine.py`): a handful of verbs on
one user's sandbox (inspect, create, start, restart, stop, pause, resume, remove, connect) and
the facts the engine decides with. A new backend is a driver of these verbs (docs/backends.md);
everything about *when* to do what (the per-user slot, the warm path, drift, readiness, idle
reaping, cancels) is the engine's, once for all drivers."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from orchestrator.sandboxes.agent_deploy import AgentRelease
from orchestrator.sandboxes.agent_launch import AgentLaunch
from orchestrator.sandboxes.base import SandboxStatus, SandboxUser
from orchestrator.sandboxes.lifecycle_decision import Observed
from orchestrator.sandboxes.slots import AgentSlot
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable

S = TypeVar("S", bound=AgentSlot)


@dataclass(frozen=True)
class SandboxIdentity:
    uid: int
    gid: int
    extra_gids: tuple[int, ...]

    @classmethod
    def of(cls, directories: UserDirectories, user: SandboxUser) -> SandboxIdentity:
        """As root: the user's own sandbox uid and gid, with share/'s common gid and each group
        workspace's own gid (exactly the plan's groups). Not root: the directories belong to
        us, so the sandbox runs as us."""
        if not directories.chown:
            return cls(os.geteuid(), os.getegid(), ())
        uid = directories.sandbox_uid(user.user_id)
        return cls(uid, uid, (directories.shared_gid, *user.plan.group_gids))


@dataclass(frozen=True)
class Wanted:
    """What the user's call wants the sandbox to run: its plan, its image (as the driver names
    it: an image id, a reference) and the host's agent BUILD; `spec` is the driver's own form."""

    plan_hash: str
    image: str | None
    agent_build: str
    spec: Any = None


@dataclass(frozen=True)
class Inspection:
    """The user's sandbox as the platform shows it."""

    state: Observed
    outdated: bool = False  # another plan, image, runtime or limits than `Wanted`
    plan_hash: str | None = None
    image: str | None = None
    sandbox_id: str | None = None  # the container's id, the pod's uid
    group_gids: frozenset[int] | None = None  # the workspace gids it runs with (None: not known)
    handle: Any = None  # the driver's own object (a container, a pod)

    def unanswered(self) -> Inspection:
        """Running, but its agent does not answer as this user's (hung, token gone): it is replaced."""
        return Inspection(Observed.ENDED, self.outdated, self.plan_hash, self.image, self.sandbox_id, self.group_gids, self.handle)


@dataclass(frozen=True)
class Progress:
    """How a start goes, as the platform says: `failed` ends the wait at once in these words;
    `waiting_for` is what a timeout will say; `answers` whether the agent may answer yet."""

    failed: str | None = None
    waiting_for: str | None = None
    answers: bool = True


@dataclass(frozen=True)
class Found:
    """One sandbox of this instance listed on the platform (adoption, status)."""

    user_id: int | None
    name: str
    running: bool
    handle: Any = None


class SandboxDriver(Protocol[S]):
    name: str
    pauses: bool  # the platform can freeze a sandbox
    restarts_in_place: bool  # the agent can restart in the same sandbox (docker), else it is created again
    api_name: str  # "the Docker engine", "the Kubernetes API": in the errors of `api_errors`
    api_errors: tuple[type[BaseException], ...]  # a platform API failing: the call gets `sandbox_unavailable`
    ready_timeout_s: float  # how long a start may take until its agent answers
    reconnects: bool  # a running sandbox's agent is talked to afresh (adopted, or a call failed), else replaced
    spares_calls_in_flight: bool  # an agent a call could not reach is not replaced while others run on it
    ready_poll_s: tuple[float, float]  # first and longest pause between readiness checks
    progress_every_s: float  # how often a starting sandbox's state is read (0: each check)

    def new_slot(self, user_id: int) -> S: ...

    def launch_options(self) -> dict[str, Any]:
        """`prepare_agent_launch`'s platform arguments (listen port, kernel, egress)."""

    def api_error(self, exc: BaseException) -> str:
        """One of `api_errors` in words."""

    # --- facts ---
    def wanted(self, user: SandboxUser) -> Wanted:
        """May ask the platform (an image's id); raises `ToolError` when the user cannot run."""

    def wanted_now(self, user: SandboxUser) -> tuple[str, str | None] | None:
        """(plan hash, image) without asking the platform; None when it cannot tell (the warm path
        then sends the call to `ensure`)."""

    def inspect(self, slot: S, wanted: Wanted | None) -> Inspection:
        """`outdated` is judged against `wanted` when given."""

    def listed(self) -> Iterable[Found]:
        """This instance's sandboxes on the platform."""

    def status(self, found: Found, slot: S) -> SandboxStatus: ...

    # --- verbs ---
    def adopt(self, slot: S, found: Found) -> None:
        """Take over a sandbox a predecessor started (a paused one is thawed)."""

    def discard(self, found: Found) -> None:
        """Remove a sandbox of a user this orchestrator does not know."""

    def sandbox_name(self, user_id: int) -> str:
        """The container's or pod's name, for logs and errors."""

    def client(self, slot: S, token: str) -> AgentClient:
        """The client of the agent in the slot's sandbox (connect)."""

    def usable(self, slot: S) -> bool:
        """Cheap, no platform asked: whether the slot's sandbox can take a call as far as the
        driver knows (a process that exited cannot)."""

    def create(self, slot: S, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        """Create and start a sandbox for `user` (a name taken by a leftover is freed first);
        the slot then names it (`sandbox_id`)."""

    def start(self, slot: S, seen: Inspection) -> None: ...

    def restart(self, slot: S, seen: Inspection) -> None:
        """The same sandbox, its agent started again (only when `restarts_in_place`)."""

    def remove(self, slot: S, seen: Inspection | None, *, kill: bool) -> None:
        """Remove the user's sandbox; `kill`: its agent must not go on (stalled)."""

    def stop(self, slot: S, reason: str) -> None: ...

    def pause(self, slot: S) -> bool: ...

    def resume(self, slot: S) -> None: ...

    def progress(self, slot: S) -> Progress:
        """A starting sandbox's state, read from the platform."""

    def refused_for_good(self, error: AgentUnavailable) -> bool:
        """An agent's refusal waiting will not end (a forward the API server refuses)."""

    def start_failed(self, slot: S) -> dict[str, str]:
        """After a failed start: clean up, and the details the error carries (its logs)."""

    def close(self) -> None: ...
