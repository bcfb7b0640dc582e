"""What a platform must do for the lifecycle engine (`lifecycle_engine.py`): a handful of verbs on
one user's sandbox (inspect, create, start, restart, stop, pause, resume, remove, connect) and
the facts the engine decides with. A new backend is a driver of these verbs (docs/backends.md);
everything about *when* to do what (the per-user slot, the warm path, drift, readiness, idle
reaping, cancels) is the engine's, once for all drivers."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.sandboxes.agent_calls import answer_limits
from orchestrator.sandboxes.agent_deploy import AgentDeployment, AgentRelease
from orchestrator.sandboxes.agent_launch import AgentLaunch
from orchestrator.sandboxes.base import SandboxStatus, SandboxUser, image_of
from orchestrator.sandboxes.docker_spec import Limits, instance_id
from orchestrator.sandboxes.lifecycle_decision import Observed
from orchestrator.sandboxes.slots import AgentSlot
from orchestrator.settings import SandboxSettings
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable
from sandbox_agent.peer import ExpectedPeer


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


class SandboxDriver:
    """The base of every driver (JupyterHub's `Spawner` is one too): what all of them keep (the
    settings, the data layout, the agent's answer bounds, the sandboxes' limits) and the defaults of a platform that
    cannot freeze a sandbox, never restarts one in place and reaches its agent on the user's
    Unix socket. A verb without a default raises `NotImplementedError`."""

    name: str
    pauses = False  # the platform can freeze a sandbox
    restarts_in_place = False  # the agent can restart in the same sandbox (docker), else it is created again
    api_name: str  # "the Docker engine", "the Kubernetes API": in the errors of `api_errors`
    api_errors: tuple[type[BaseException], ...] = ()  # a platform API failing: the call gets `sandbox_unavailable`
    ready_timeout_s: float  # how long a start may take until its agent answers
    reconnects = True  # a running sandbox's agent is talked to afresh (adopted, or a call failed), else replaced
    spares_calls_in_flight = False  # an agent a call could not reach is not replaced while others run on it
    ready_poll_s: tuple[float, float]  # first and longest pause between readiness checks
    progress_every_s: float  # how often a starting sandbox's state is read (0: each check)

    def __init__(self, settings: SandboxSettings, directories: UserDirectories, deployment: AgentDeployment) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.directories = directories
        self.deployment = deployment
        self.ready_timeout_s = settings.ready_timeout_s
        self.answer_limits = answer_limits(settings.agent)
        self.instance = instance_id(self.layout.root)  # names and labels this data dir's sandboxes
        # ORCH_SANDBOX_CPUS / _MEMORY_MB / _PIDS: each sandbox's, unless an admin set a user's own.
        self.limits = Limits(settings.cpus, settings.memory_mb, settings.pids)

    def launch_options(self) -> dict[str, Any]:
        """`prepare_agent_launch`'s platform arguments (listen port, kernel, egress)."""
        raise NotImplementedError

    def api_error(self, exc: BaseException) -> str:
        """One of `api_errors` in words."""
        return repr(exc)

    def image(self, user: SandboxUser) -> str:
        """The image (reference) the user's sandbox runs: its template's, else ORCH_SANDBOX_IMAGE."""
        return image_of(user, self.settings.image)

    def ca_bundle(self) -> Path | None:
        """The host's CA bundle for pip and npm behind the egress proxy (docs/egress.md), when
        egress is on and the bundle exists."""
        bundle = self.settings.ca_bundle
        return bundle if self.settings.egress != "off" and bundle.is_file() else None

    # --- facts ---
    def wanted(self, user: SandboxUser) -> Wanted:
        """May ask the platform (an image's id); raises `ToolError` when the user cannot run."""
        raise NotImplementedError

    def wanted_now(self, user: SandboxUser) -> tuple[str, str | None] | None:
        """(plan hash, image) without asking the platform; None when it cannot tell (the warm path
        then sends the call to `ensure`)."""
        raise NotImplementedError

    def inspect(self, slot: AgentSlot, wanted: Wanted | None) -> Inspection:
        """`outdated` is judged against `wanted` when given."""
        raise NotImplementedError

    def listed(self) -> Iterable[Found]:
        """This instance's sandboxes on the platform."""
        raise NotImplementedError

    def status(self, found: Found, slot: AgentSlot) -> SandboxStatus:
        raise NotImplementedError

    # --- verbs ---
    def adopt(self, slot: AgentSlot, found: Found) -> None:
        """Take over a sandbox a predecessor started (a paused one is thawed)."""
        raise NotImplementedError

    def discard(self, found: Found) -> None:
        """Remove a sandbox of a user this orchestrator does not know."""
        raise NotImplementedError

    def sandbox_name(self, user_id: int) -> str:
        """The container's or pod's name, for logs and errors."""
        raise NotImplementedError

    def expected_peer(self, slot: AgentSlot) -> ExpectedPeer | None:
        """What shows that a socket's listener is the slot's sandbox (None: anyone may be)."""
        return None

    def client(self, slot: AgentSlot, token: str) -> AgentClient:
        """The client of the agent in the slot's sandbox (connect): on the user's socket, which
        as root only a listener showing `expected_peer` is spoken to, wherever its path leads."""
        return AgentClient(
            self.layout.socket_path(slot.user_id), token, expected_peer=self.expected_peer(slot),
            answer_limits=self.answer_limits,
        )  # fmt: skip

    def usable(self, slot: AgentSlot) -> bool:
        """Cheap, no platform asked: whether the slot's sandbox can take a call as far as the
        driver knows. By default yes: a call to a gone sandbox fails undelivered, and the
        router forgets it and ensures."""
        return True

    def create(self, slot: AgentSlot, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        """Create and start a sandbox for `user` (a name taken by a leftover is freed first);
        the slot then names it (`sandbox_id`)."""
        raise NotImplementedError

    def start(self, slot: AgentSlot, seen: Inspection) -> None:
        raise AssertionError(f"{self.name}: a sandbox is never stopped to start again: the table says recreate")

    def restart(self, slot: AgentSlot, seen: Inspection) -> None:
        """The same sandbox, its agent started again (only when `restarts_in_place`)."""
        raise AssertionError(f"{self.name}: a sandbox is never restarted in place: the table says recreate")

    def remove(self, slot: AgentSlot, seen: Inspection | None, *, kill: bool) -> None:
        """Remove the user's sandbox; `kill`: its agent must not go on (stalled)."""
        raise NotImplementedError

    def stop(self, slot: AgentSlot, reason: str) -> None:
        raise NotImplementedError

    def pause(self, slot: AgentSlot) -> bool:
        return False  # only when `pauses`

    def resume(self, slot: AgentSlot) -> None:
        pass  # never paused

    def progress(self, slot: AgentSlot) -> Progress:
        """A starting sandbox's state, read from the platform."""
        raise NotImplementedError

    def refused_for_good(self, error: AgentUnavailable) -> bool:
        """An agent's refusal waiting will not end (a forward the API server refuses)."""
        return False

    def start_failed(self, slot: AgentSlot) -> dict[str, str]:
        """After a failed start: clean up, and the details the error carries (its logs)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
