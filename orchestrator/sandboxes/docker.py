"""The docker backend: one long-lived container per user, built from the mount plan,
talked to over the agent's Unix socket (never over the container's IP).

- The warm path of a tool call touches no Docker API: the user's slot caches the container's
  plan hash, image and agent BUILD and the call goes straight to the agent's socket. The slow
  path (first call, a drift, a dead agent) inspects the container and applies `decide()`.
- A per-user lock makes concurrent first calls create exactly one container.
- On start, this orchestrator's containers (label `instance` = its data dir) are adopted, and
  those of users it does not know are removed.
- After the router forgot the agent (a failed call) the next `ensure` inspects the container
  and recovers it; a container whose agent missed a deadline (paused, stopped, hung) is
  replaced. The calls, their one retry and their errors are the router's (docs/backends.md).
- Idle containers are paused (`docker pause`, the cgroup freezer) and later stopped by
  `reap_idle` (a periodic task of the composition root, whose first round also adopts, deciding
  with `idle_action`); the next call unpauses a paused one. Containers outlive the orchestrator,
  but not for long: each container's supervisor (PID 1) ends it once the lease this backend
  renews for it has expired (`lease.py`), and adoption renews the leases and thaws the paused
  ones of this instance (docs/lifecycle.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container

from orchestrator.clock import iso
from orchestrator.sandboxes.agent_deploy import AgentDeployment
from orchestrator.sandboxes.agent_calls import HEALTH_TIMEOUT_S, answer_limits, sandbox_unavailable
from orchestrator.sandboxes.agent_launch import prepare_agent_launch
from orchestrator import metrics
from orchestrator.sandboxes.base import (
    image_of,
    IdleAction,
    LiveAgent,
    SandboxStatus,
    SandboxUser,
    idle_action,
    loses_group_access,
    runs_processes,
)
from orchestrator.sandboxes.docker_spec import (
    LABEL_BUILD,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_PLAN,
    MANAGED_VALUE,
    Action,
    ContainerSpec,
    Desired,
    Limits,
    container_name,
    container_spec,
    decide,
    instance_id,
    observed_from_attrs,
    user_of,
)
from orchestrator.sandboxes.lease import LeaseRenewer
from orchestrator.sandboxes.slots import AgentSlot, SlotTable, live_agent, reconnect
from orchestrator.sandboxes.warden import Warden
from orchestrator.sandboxes.image.compat import ImageFit, expected_agent_lock, image_fit, stale_image_message
from orchestrator.log import kv
from orchestrator.settings import Settings
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable
from sandbox_agent.peer import ExpectedPeer

log = logging.getLogger(__name__)

IMAGE_RECHECK_S = 5.0  # how stale the cached id of ORCH_SANDBOX_IMAGE may be on the warm path
PARALLEL_STARTS = 4  # cold starts at once: more only thrash two cores and time out together
STOP_TIMEOUT_S = 5


def engine_problem(timeout: float = 3.0) -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
        return None
    except DockerException as exc:
        return str(exc)


def image_labels(image: str, timeout: float = 3.0) -> dict[str, str] | None:
    """The image's labels; None when it is absent (or the engine does not answer)."""
    try:
        client = docker.from_env(timeout=timeout)
        try:
            return dict(client.images.get(image).labels or {})
        finally:
            client.close()
    except (DockerException, ImageNotFound):
        return None


@dataclass
class _Slot(AgentSlot):
    """One user's container as this orchestrator knows it (`AgentSlot`: its agent, its calls)."""

    container_id: str | None = None
    image_id: str | None = None
    stopped: bool = False  # stopped by us (idle, or asked); the next call starts it again


def sandbox_peer(runtime: str, sandbox_uid: int, container_id: str) -> ExpectedPeer:
    """Pure: what shows that a socket's peer is the user's sandbox. Under runc its agent is a
    host process of the sandbox's uid. Under runsc every socket the sandbox has on the host is
    its gofer's, a root process in the container's cgroup: the container is the fact (uid 0
    would also be dockerd's, another sandbox's gofer's or any root daemon's)."""
    if runtime == "runsc":
        return ExpectedPeer(container_id=container_id)
    return ExpectedPeer(uid=sandbox_uid)


def docker_time(text: str | None) -> str | None:
    """Pure: Docker's `2026-12-01T13:49:58.955123456Z` in the stored form; None for its zero time."""
    if not text or text.startswith("0001-"):
        return None
    head, _, fraction = text.rstrip("Z").partition(".")
    moment = datetime.fromisoformat(head).replace(tzinfo=timezone.utc, microsecond=int((fraction + "000000")[:6]))
    return iso(moment)


class DockerBackend:
    name = "docker"

    def __init__(
        self,
        settings: Settings,
        directories: UserDirectories,
        deployment: AgentDeployment,
        *,
        known_user: Callable[[int], bool],
        client: docker.DockerClient | None = None,
    ) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.directories = directories
        self.deployment = deployment
        self.known_user = known_user
        self.client = client or docker.from_env(timeout=60, max_pool_size=32)
        self.instance = instance_id(self.layout.root)
        self.limits = Limits(settings.sandbox_cpus, settings.sandbox_memory_mb, settings.sandbox_pids)
        self._slots: SlotTable[_Slot] = SlotTable(_Slot)
        self._starts = threading.BoundedSemaphore(PARALLEL_STARTS)
        self._answer_limits = answer_limits(settings)
        self._images: dict[str, tuple[str, float]] = {}  # reference -> (id, when resolved)
        self._expected_lock = expected_agent_lock()
        self._adopted = False
        self._adopt_lock = threading.Lock()
        self._warden = Warden(self.instance)  # thaws our paused containers should we vanish
        # The lease each container's supervisor ends it without (sandboxes/lease.py).
        self._leases = LeaseRenewer(
            directories, settings.idle_timeout_s + settings.dead_man_margin_s, self._leased_users
        )  # fmt: skip

    # --- the backend's own lifecycle ------------------------------------------------------
    def close(self) -> None:
        """Drop the agents' clients; sandboxes keep running and are adopted by the next start
        (or end by themselves once their lease, no longer renewed, has expired)."""
        self._leases.close()
        self._slots.drop_agents()
        self.client.close()
        self._warden.close()  # thaws the paused ones: their agents' own switch bounds them

    def adopt(self) -> list[int]:
        """Take over the containers labelled with this instance (once); remove those of users
        this orchestrator does not know. Returns the adopted users."""
        with self._adopt_lock:
            if self._adopted:
                return []
            adopted = []
            for container in self._managed_containers():
                user_id = user_of(container.labels)
                if user_id is None or not self.known_user(user_id):
                    log.warning("removing the sandbox of an unknown user %s", kv(container=container.name, user=user_id))
                    self._remove(container)
                    continue
                self._leases.renew(user_id)  # before a thaw: an expired lease would end it at once
                if container.status == "paused":
                    # Frozen by a predecessor: thawed, so its agent's own idle timer runs again
                    # (it stops itself if idle too long) and calls reach it as usual.
                    self._unpause(container)
                slot = self._slot(user_id)
                with slot.lock:
                    slot.container_id = container.id
                    slot.count.touch()
                    # Its agent may run background processes: ask before an idle stop.
                    slot.count.note_processes(None, started_for_s=self.settings.process_max_runtime_s)
                    slot.stopped = container.status not in ("running", "paused")
                adopted.append(user_id)
                log.info("adopted a sandbox %s", kv(user=user_id, container=container.short_id, status=container.status))
            self._adopted = True
            self._leases.start()  # renews the leases of the managed ones periodically
            return adopted

    def _leased_users(self) -> list[int]:
        """The users whose container this orchestrator manages: their leases are renewed."""
        return [slot.user_id for slot in self._slots.all() if slot.container_id is not None]

    # --- SandboxBackend -------------------------------------------------------------------
    def ensure(self, user: SandboxUser) -> LiveAgent:
        self.adopt()
        slot = self._slot(user.user_id)
        with slot.lock:
            self._ensure_locked(slot, user)
            assert slot.live is not None
            slot.count.touch()
            return slot.live

    def warm(self, user: SandboxUser) -> LiveAgent | None:
        """The slot's agent when the call can go straight to it: adopted, nothing drifted, and
        no slow path holds the slot (nothing here waits or calls Docker)."""
        image = self._images.get(self._image_of(user))
        if not self._adopted or image is None or time.monotonic() - image[1] >= IMAGE_RECHECK_S:
            return None
        slot = self._slots.get(user.user_id)
        if slot is None or not slot.lock.acquire(blocking=False):
            return None
        try:
            if (
                slot.live is None
                or slot.count.paused
                or slot.stalled
                or slot.forgotten
                or slot.plan_hash != user.plan.plan_hash
                or slot.image_id != image[0]
                or slot.running_build != self.deployment.build
            ):
                return None
            return slot.live
        finally:
            slot.lock.release()

    def resume(self, user: SandboxUser) -> LiveAgent | None:
        slot = self._slots.get(user.user_id)
        if slot is None or not slot.count.paused:
            return None
        with slot.lock:
            if not slot.count.paused:
                return None  # resumed meanwhile: `warm`/`ensure` decide
            self._thaw_locked(slot)
        return self.warm(user)  # None when something drifted: `ensure` handles it

    def _thaw_locked(self, slot: _Slot) -> None:
        started = time.monotonic()
        container = self._find(slot)
        if container is not None and container.status == "paused":
            self._unpause(container)
        slot.count.unpause()
        metrics.observe_start(self.name, "resume", time.monotonic() - started)
        log.info("sandbox resumed %s", kv(user=slot.user_id, container=container.short_id if container else None))

    def _unpause(self, container: Container) -> None:
        try:
            container.unpause()
        except NotFound:
            pass
        except APIError as exc:  # e.g. thawed by someone else meanwhile: the state says
            log.warning("unpausing a sandbox failed %s", kv(container=container.short_id, error=exc.explanation))
        container.reload()

    def forget(self, user_id: int, *, agent: LiveAgent | None = None, stalled: bool = False) -> None:
        self._slots.forget(user_id, agent=agent, stalled=stalled)

    def cancel_calls(self, user_id: int, *, run_id: str | None = None, session_id: str | None = None) -> int:
        return self._slots.cancel_calls(user_id, run_id=run_id, session_id=session_id, stop=self.stop)

    def stop(self, user_id: int) -> None:
        slot = self._slot(user_id)
        with slot.lock:
            self._stop_locked(slot, reason="requested")

    def status(self) -> list[SandboxStatus]:
        statuses = []
        for container in self._managed_containers():
            user_id = user_of(container.labels)
            if user_id is None:
                continue
            slot = self._slot(user_id)
            statuses.append(
                SandboxStatus(
                    user_id=user_id,
                    backend=self.name,
                    state=container.status if container.status in ("running", "paused") else "stopped",
                    plan_hash=container.labels.get(LABEL_PLAN),
                    agent_build=slot.running_build or container.labels.get(LABEL_BUILD),
                    busy=slot.count.in_flight,
                    detail={"container": container.name, "container_id": container.id, "status": container.status},
                    since=docker_time(container.attrs.get("State", {}).get(
                        "StartedAt" if container.status in ("running", "paused") else "FinishedAt"
                    )),
                )
            )
        return sorted(statuses, key=lambda s: s.user_id)

    # --- the slow path ----------------------------------------------------------------------
    def _ensure_locked(self, slot: _Slot, user: SandboxUser) -> None:
        desired = Desired(
            user.plan.plan_hash, self._image_id(user), self.deployment.build, self.settings.sandbox_runtime
        )
        if slot.count.paused:
            self._thaw_locked(slot)  # e.g. the retry of a call: then judged like any other
        if slot.stalled:
            self._remove_stalled(slot)
        elif slot.forgotten:
            slot.forget_agent()  # inspect the container and talk to its agent afresh
        if (
            slot.live is not None
            and slot.plan_hash == desired.plan_hash
            and slot.image_id == desired.image_id
            and slot.running_build == desired.agent_build
        ):
            return  # the warm path: no Docker API call
        container = self._find(slot)
        observed = observed_from_attrs(container.attrs) if container is not None else None
        if container is not None and observed is not None and observed.running and slot.live is None:
            # Adopted, or contact lost: ask the agent that runs there which BUILD it is.
            if not self._reconnect(slot, container):
                # Running but its agent does not answer (hung, or its token is gone): replace it.
                observed = replace(observed, running=False, exit_code=-1)
                slot.count.note_processes(0)  # nothing of that agent is kept
        # A call in flight, or background processes (asked afresh: this is the slow path).
        busy = slot.count.in_flight > 0 or runs_processes(slot.live, slot.count)
        if busy and container is not None:  # a revoked group does not wait for the calls under way
            running_gids = {int(g) for g in container.attrs.get("HostConfig", {}).get("GroupAdd") or []}
            busy = not loses_group_access(running_gids - {self.directories.shared_gid}, user.plan.group_gids)
        action = decide(observed, desired, running_build=slot.running_build, busy=busy)
        if action is Action.USE:
            slot.plan_hash, slot.image_id = (observed.plan_hash, observed.image_id) if observed else (None, None)
            return
        log.info(
            "sandbox %s %s",
            action.value,
            kv(user=user.user_id, container=container.short_id if container else None,
               plan_changed=observed is not None and observed.plan_hash != desired.plan_hash,
               image_changed=observed is not None and observed.image_id != desired.image_id,
               running_build=slot.running_build, host_build=desired.agent_build),
        )  # fmt: skip
        slot.forget_agent()
        slot.count.note_processes(0)  # a new agent (or container) runs none of the old one's
        with self._starts:
            started = time.monotonic()
            release = self.deployment.ensure()
            try:
                launch = prepare_agent_launch(
                    self.settings, self.directories, user, in_sandbox=True, parent_pid=None,
                    host_kernel=self.settings.sandbox_runtime == "runc",
                )  # fmt: skip
            except (OSError, RuntimeError, UnsafeDirectory) as exc:
                raise sandbox_unavailable(user.user_id, f"preparing it failed: {exc}") from exc
            try:
                self._leases.renew(user.user_id)  # before the start: its supervisor reads it first
                if action in (Action.CREATE, Action.RECREATE):
                    if container is not None:
                        self._remove(container)
                    container = self._create(user, desired.image_id, release.build)
                    container.start()
                elif action is Action.START:
                    assert container is not None
                    container.start()
                else:  # RESTART_AGENT: same container, same mounts; the agent code is mounted
                    assert container is not None  # read-only, so the restart runs the new BUILD
                    container.restart(timeout=STOP_TIMEOUT_S)
            except APIError as exc:
                raise sandbox_unavailable(user.user_id, f"docker refused: {exc.explanation}") from None
            slot.container_id = container.id
            slot.plan_hash = desired.plan_hash
            slot.image_id = desired.image_id
            slot.stopped = False
            agent = self._agent_client(user.user_id, launch.token, container.id)
            self._wait_ready(slot, container, agent, launch.config.instance_id, launch.token)
            log.info(
                "sandbox ready %s",
                kv(user=user.user_id, container=container.short_id, action=action.value,
                   build=slot.running_build, seconds=round(time.monotonic() - started, 3)),
            )  # fmt: skip
            metrics.observe_start(self.name, "cold", time.monotonic() - started)

    def _create(self, user: SandboxUser, image_id: str, build: str) -> Container:
        if self.directories.chown:
            uid = gid = self.directories.sandbox_uid(user.user_id)
            # share/'s common gid, and each group workspace's own gid: exactly the plan's groups.
            extra: tuple[int, ...] = (self.directories.shared_gid, *user.plan.group_gids)
        else:  # not root: the directories belong to us, so the sandbox runs as us
            uid, gid, extra = os.geteuid(), os.getegid(), ()
        spec = container_spec(
            instance=self.instance,
            plan=user.plan,
            image=self._image_of(user),
            image_id=image_id,
            agent_build=build,
            sandbox_uid=uid,
            sandbox_gid=gid,
            extra_gids=extra,
            network=self.settings.sandbox_network,
            limits=self.limits,
            agent_dir=self.layout.agent_current,
            home_dir=self.layout.home_dir(user.user_id),
            config_path=self.layout.agent_config_path(user.user_id),
            lease_path=self.layout.lease_path(user.user_id),
            ca_bundle=self._ca_bundle(),
            runtime=self.settings.sandbox_runtime,
        )
        try:
            return self._create_from(spec)
        except APIError as exc:
            if exc.status_code != 409:
                raise
        # The name is taken: a container this slot did not know (e.g. one created by a crashed
        # orchestrator between `create` and its bookkeeping). Ours by label: replace it.
        self._remove(self.client.containers.get(spec.name))
        return self._create_from(spec)

    def _create_from(self, spec: ContainerSpec) -> Container:
        """Through the low-level API: docker-py's `containers.create` cannot mask paths."""
        api = self.client.api
        created = api.create_container(host_config=spec.host_config(api), **spec.create_container_kwargs())
        return self.client.containers.get(created["Id"])

    def _ca_bundle(self) -> Path | None:
        """The host's CA bundle for pip and npm behind the egress proxy (docs/egress.md)."""
        bundle = self.settings.egress_ca_bundle
        return bundle if self.settings.egress != "off" and bundle.is_file() else None

    def _reconnect(self, slot: _Slot, container: Container) -> bool:
        """The agent already running in `container` (`slots.reconnect`); as root only over a
        socket whose peer is the user's own uid. False: the caller replaces the container."""
        if not reconnect(slot, self.directories, lambda token: self._agent_client(slot.user_id, token, container.id)):
            return False
        slot.container_id = container.id
        return True

    def peer_container(self, user_id: int) -> str | None:
        """The container whose processes are the user's sandbox at the other end of a socket
        when the uid says nothing (runsc: `sandbox_peer`); None under runc. For the egress
        proxy, which also takes the sandbox's uid (a user on the process backend)."""
        slot = self._slots.get(user_id)
        return slot.container_id if slot is not None and self.settings.sandbox_runtime == "runsc" else None

    def _agent_client(self, user_id: int, token: str, container_id: str) -> AgentClient:
        """The client of the user's agent; as root it only talks to a socket served by the
        user's own sandbox (`sandbox_peer`), whatever the socket's path leads to."""
        peer = None
        if self.directories.chown:
            peer = sandbox_peer(self.settings.sandbox_runtime, self.directories.sandbox_uid(user_id), container_id)
        return AgentClient(
            self.layout.socket_path(user_id), token, expected_peer=peer, answer_limits=self._answer_limits
        )  # fmt: skip

    def _remove_stalled(self, slot: _Slot) -> None:
        """A container whose agent missed a deadline (paused, stopped, hung) is removed, so the
        slow path creates a fresh one; `docker rm -f` also takes a paused container."""
        container = self._find(slot)
        log.warning("replacing a stalled sandbox %s", kv(user=slot.user_id, container=container.short_id if container else None))
        slot.forget_agent()
        if container is not None:
            self._remove(container)
        slot.container_id = None
        slot.stalled = False

    def _wait_ready(self, slot: _Slot, container: Container, agent: AgentClient, instance: str, token: str) -> None:
        """Ready = our agent (the instance id we wrote) answers /health on the socket."""
        timeout = self.settings.sandbox_ready_timeout_s
        deadline = time.monotonic() + timeout
        next_state_check = time.monotonic() + 0.5
        delay = 0.005
        while True:
            try:
                health = agent.health(timeout_s=HEALTH_TIMEOUT_S)
                if health.instance_id == instance:
                    slot.running_build = health.build
                    slot.live = live_agent(slot, agent, token)
                    return
            except AgentUnavailable:
                pass
            now = time.monotonic()
            if now >= next_state_check:
                container.reload()
                if container.status not in ("running", "created", "restarting"):
                    self._fail_start(slot, container, agent, f"the container exited ({container.status})")
                next_state_check = now + 0.5
            if now >= deadline:
                self._fail_start(slot, container, agent, f"its agent did not answer /health within {timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _fail_start(self, slot: _Slot, container: Container, agent: AgentClient, why: str) -> None:
        agent.close()
        try:
            logs = container.logs(tail=20).decode(errors="replace").strip()
        except DockerException:
            logs = ""
        log.error("sandbox failed to start %s", kv(user=slot.user_id, container=container.short_id, why=why, logs=logs))
        raise sandbox_unavailable(slot.user_id, f"it did not start: {why}", container=container.name, logs=logs[-2000:])

    def _stop_locked(self, slot: _Slot, *, reason: str) -> None:
        slot.forget_agent()
        slot.count.note_processes(0)  # a stopped container's processes are gone with it
        slot.stopped = True
        container = self._find(slot)
        if container is not None and container.status == "paused":
            self._unpause(container)  # a frozen process cannot act on the stop signal
        slot.count.unpause()
        if container is None or container.status != "running":
            return
        log.info("stopping a sandbox %s", kv(user=slot.user_id, container=container.short_id, reason=reason))
        try:
            container.stop(timeout=STOP_TIMEOUT_S)
        except NotFound:
            pass

    # --- idleness ---------------------------------------------------------------------------
    def reap_idle(self, now: float | None = None) -> list[int]:
        """Stop the containers idle for `idle_timeout_s`; returns their users. Adopts first
        (once): the first round after a start takes over the containers of the last run."""
        self.adopt()
        now = time.monotonic() if now is None else now
        slots = self._slots.all()
        stopped = []
        for slot in slots:
            if not slot.lock.acquire(blocking=False):
                continue  # being started or used right now: not idle
            try:
                if slot.container_id is None or slot.stopped:
                    continue
                processes = False
                if not slot.count.paused:  # a frozen agent ran none when it was paused
                    if slot.live is None and slot.count.processes != 0:  # adopted, or contact lost: ask its agent
                        container = self._find(slot)
                        if container is not None and container.status == "running":
                            self._reconnect(slot, container)
                    processes = runs_processes(slot.live, slot.count)
                action = idle_action(
                    idle_s=now - slot.count.last_used,
                    in_flight=slot.count.in_flight,
                    paused=slot.count.paused,
                    has_running_processes=processes,  # background processes: busy, whatever the calls
                    pause_after_s=self.settings.pause_after_s,
                    idle_timeout_s=self.settings.idle_timeout_s,
                )
                if action is IdleAction.STOP:
                    self._stop_locked(slot, reason="idle")
                    stopped.append(slot.user_id)
                elif action is IdleAction.PAUSE and self._pause_locked(slot):
                    pass
                else:
                    continue
                metrics.SANDBOX_IDLE_ACTIONS.labels(self.name, action.value).inc()
            finally:
                slot.lock.release()
        return stopped

    def _pause_locked(self, slot: _Slot) -> bool:
        """Freeze the slot's container (the cgroup freezer); False when a call came first or
        the engine refused (it then stays running, and is stopped later as before)."""
        if not slot.count.pause_if_idle():
            return False
        self._warden.started()  # before the freeze: nothing frozen without a warden
        container = self._find(slot)
        try:
            if container is None or container.status != "running":
                raise NotFound("not running")
            container.pause()
        except (APIError, NotFound) as exc:
            slot.count.unpause()
            log.warning("pausing a sandbox failed %s", kv(user=slot.user_id, error=exc))
            return False
        log.info("idle sandbox paused %s", kv(user=slot.user_id, container=container.short_id))
        return True

    # --- Docker helpers -----------------------------------------------------------------------
    def _slot(self, user_id: int) -> _Slot:
        return self._slots.slot(user_id)

    def _find(self, slot: _Slot) -> Container | None:
        for key in (slot.container_id, container_name(self.instance, slot.user_id)):
            if key is None:
                continue
            try:
                return self.client.containers.get(key)
            except NotFound:
                continue
        return None

    def _managed_containers(self) -> list[Container]:
        filters = {"label": [f"{LABEL_MANAGED}={MANAGED_VALUE}", f"{LABEL_INSTANCE}={self.instance}"]}
        return self.client.containers.list(all=True, filters=filters)

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except NotFound:
            pass

    def _image_of(self, user: SandboxUser) -> str:
        return image_of(user, self.settings.sandbox_image)

    def _image_id(self, user: SandboxUser) -> str:
        reference = self._image_of(user)
        now = time.monotonic()
        known = self._images.get(reference)
        if known is not None and now - known[1] < IMAGE_RECHECK_S:
            return known[0]
        try:
            image = self.client.images.get(reference)
        except ImageNotFound:
            if user.template is not None:
                raise sandbox_unavailable(
                    user.user_id, f"the image of template {user.template.name!r} ({reference}) is not on this host"
                ) from None
            raise sandbox_unavailable(
                user.user_id,
                f"the sandbox image {reference} is not built on this host; "
                "an operator must run `orchestrator build-image`",
            ) from None
        if image_fit(image.labels, self._expected_lock) is ImageFit.STALE:
            message = stale_image_message(reference)
            if user.template is not None:
                message += f", then PUT template {user.template.name!r} again to rebuild it over the new image"
            raise sandbox_unavailable(user.user_id, message)
        self._images[reference] = (image.id, now)
        return image.id
