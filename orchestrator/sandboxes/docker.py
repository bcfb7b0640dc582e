"""The docker driver of the lifecycle engine (`lifecycle_engine.py`): one long-lived container
per user, built from the mount plan (`docker_spec.py`), its agent reached over its Unix socket
(never over the container's IP).

- The slot caches the container's image id; the warm path trusts a resolved image id for
  `IMAGE_RECHECK_S`, then `ensure` resolves it again (a rebuilt image is a new id).
- An exit by SIGTERM is our own stop: the same container starts again; any other exit is
  replaced. A drifted agent BUILD restarts the container in place (the agent code is mounted
  read-only).
- Pause is `docker pause` (the cgroup freezer); a warden thaws the paused containers of this
  instance should the orchestrator vanish. Containers outlive the orchestrator, but not for
  long: each container's supervisor (PID 1) ends it once the lease this driver renews for it
  has expired (`lease.py`); adoption renews the leases and thaws the paused ones
  (docs/lifecycle.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container

from orchestrator.log import kv
from orchestrator.sandboxes.agent_calls import sandbox_unavailable
from orchestrator.sandboxes.agent_deploy import AgentDeployment, AgentRelease
from orchestrator.sandboxes.agent_launch import AgentLaunch
from orchestrator.sandboxes.base import SandboxStatus, SandboxUser
from orchestrator.sandboxes.docker_spec import (
    LABEL_BUILD,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_PLAN,
    MANAGED_VALUE,
    ContainerSpec,
    Desired,
    container_name,
    container_outdated,
    container_spec,
    container_state,
    docker_time,
    observed_from_attrs,
    sandbox_peer,
    user_of,
)
from orchestrator.sandboxes.image.compat import ImageFit, expected_agent_lock, image_fit, stale_image_message
from orchestrator.sandboxes.lease import LeaseRenewer
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState
from orchestrator.sandboxes.lifecycle_engine import LifecycleEngine
from orchestrator.sandboxes.sandbox_driver import Found, Inspection, Progress, SandboxDriver, SandboxIdentity, Wanted
from orchestrator.sandboxes.slots import AgentSlot
from orchestrator.sandboxes.warden import Warden
from orchestrator.settings import SandboxSettings
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.peer import ExpectedPeer

log = logging.getLogger(__name__)

IMAGE_RECHECK_S = 5.0  # how stale the cached id of ORCH_SANDBOX_IMAGE may be on the warm path
STOP_TIMEOUT_S = 5


@contextmanager
def _refusals(user_id: int) -> Iterator[None]:
    try:
        yield
    except APIError as exc:
        raise sandbox_unavailable(user_id, f"docker refused: {exc.explanation}") from None


class DockerDriver(SandboxDriver):
    """The verbs of the lifecycle engine on the Docker engine. The slot's `sandbox_id` is the
    container's id, its `image` the image id. Docker's refusals are worded where they happen
    (no `api_errors`)."""

    name = "docker"
    pauses = True  # `docker pause`: the cgroup freezer
    restarts_in_place = True  # the agent code is mounted read-only: a restart runs the new BUILD
    api_name = "the Docker engine"
    ready_poll_s = (0.005, 0.05)
    progress_every_s = 0.5

    def __init__(
        self, settings: SandboxSettings, directories: UserDirectories, deployment: AgentDeployment, engine: docker.DockerClient
    ) -> None:
        super().__init__(settings, directories, deployment)
        self.engine = engine
        self._images: dict[str, tuple[str, float]] = {}  # reference -> (id, when resolved)
        self._expected_lock = expected_agent_lock()
        self._warden = Warden(self.instance)  # thaws our paused containers should we vanish
        self.slot_ids: Callable[[], list[int]] = list  # the users whose container is managed (set by the backend)
        # The lease each container's supervisor ends it without (sandboxes/lease.py).
        self._leases = LeaseRenewer(
            directories, settings.idle_timeout_s + settings.dead_man_margin_s, lambda: self.slot_ids()
        )  # fmt: skip
        self._leases.start()  # renews the leases of the managed ones (started or adopted) periodically

    def launch_options(self) -> dict[str, Any]:
        return {"host_kernel": self.settings.runtime == "runc"}

    def close(self) -> None:
        self._leases.close()
        self.engine.close()
        self._warden.close()  # thaws the paused ones: their agents' own switch bounds them

    # --- facts ------------------------------------------------------------------------------
    def wanted(self, user: SandboxUser) -> Wanted:
        limits = self.limits.for_user(user.cpus, user.memory_mb)
        desired = Desired(
            user.plan.plan_hash, self._image_id(user), self.deployment.build, self.settings.runtime,
            limits=(round(limits.cpus, 6), limits.memory_mb),
        )  # fmt: skip
        return Wanted(desired.plan_hash, desired.image_id, desired.agent_build, desired)

    def wanted_now(self, user: SandboxUser) -> tuple[str, str | None] | None:
        image = self._images.get(self.image(user))
        if image is None or time.monotonic() - image[1] >= IMAGE_RECHECK_S:
            return None
        return user.plan.plan_hash, image[0]

    def inspect(self, slot: AgentSlot, wanted: Wanted | None) -> Inspection:
        container = self._find(slot)
        if container is None:
            return Inspection(SandboxState.ABSENT)
        observed = observed_from_attrs(container.attrs)
        return Inspection(
            container_state(observed), wanted is not None and container_outdated(observed, wanted.spec), observed.plan_hash, observed.image_id, container.id,
            frozenset(int(g) for g in container.attrs.get("HostConfig", {}).get("GroupAdd") or []), container,
        )  # fmt: skip

    def listed(self) -> list[Found]:
        return [
            Found(user_of(c.labels), c.name, c.status in ("running", "paused"), c) for c in self._managed_containers()
        ]  # fmt: skip

    def status(self, found: Found, slot: AgentSlot) -> SandboxStatus:
        container: Container = found.handle
        assert found.user_id is not None
        return SandboxStatus(
            user_id=found.user_id,
            backend=self.name,
            state=container.status if container.status in ("running", "paused") else "stopped",
            plan_hash=container.labels.get(LABEL_PLAN),
            agent_build=slot.running_build or container.labels.get(LABEL_BUILD),
            busy=slot.count.in_flight,
            detail={"container": container.name, "container_id": container.id, "status": container.status},
            since=docker_time(container.attrs.get("State", {}).get(
                "StartedAt" if container.status in ("running", "paused") else "FinishedAt"
            )),
        )  # fmt: skip

    def sandbox_name(self, user_id: int) -> str:
        return container_name(self.instance, user_id)

    # --- verbs ------------------------------------------------------------------------------
    def adopt(self, slot: AgentSlot, found: Found) -> None:
        container: Container = found.handle
        self._leases.renew(slot.user_id)  # before a thaw: an expired lease would end it at once
        if container.status == "paused":
            # Frozen by a predecessor: thawed, so its agent's own idle timer runs again (it
            # stops itself if idle too long) and calls reach it as usual.
            self._unpause(container)
        slot.sandbox_id = container.id

    def discard(self, found: Found) -> None:
        self._remove(found.handle)

    def expected_peer(self, slot: AgentSlot) -> ExpectedPeer | None:
        if not self.directories.chown:
            return None
        assert slot.sandbox_id is not None
        return sandbox_peer(self.settings.runtime, self.directories.sandbox_uid(slot.user_id), slot.sandbox_id)

    def create(self, slot: AgentSlot, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        self._leases.renew(user.user_id)  # before the start: its supervisor reads it first
        with _refusals(user.user_id):
            container = self._create(user, self._image_id(user), release.build)
            container.start()
        slot.sandbox_id = container.id

    def start(self, slot: AgentSlot, seen: Inspection) -> None:
        self._leases.renew(slot.user_id)
        with _refusals(slot.user_id):
            seen.handle.start()

    def restart(self, slot: AgentSlot, seen: Inspection) -> None:
        self._leases.renew(slot.user_id)
        with _refusals(slot.user_id):
            seen.handle.restart(timeout=STOP_TIMEOUT_S)

    def remove(self, slot: AgentSlot, seen: Inspection | None, *, kill: bool) -> None:
        """`docker rm -f`: it also takes a paused container."""
        container = seen.handle if seen is not None else self._find(slot)
        if container is not None:
            self._remove(container)

    def stop(self, slot: AgentSlot, reason: str) -> None:
        container = self._find(slot)
        if container is not None and container.status == "paused":
            self._unpause(container)  # a frozen process cannot act on the stop signal
        if container is None or container.status != "running":
            return
        log.info("stopping a sandbox %s", kv(user=slot.user_id, container=container.short_id, reason=reason))
        try:
            container.stop(timeout=STOP_TIMEOUT_S)
        except NotFound:
            pass

    def pause(self, slot: AgentSlot) -> bool:
        self._warden.started()  # before the freeze: nothing frozen without a warden
        container = self._find(slot)
        try:
            if container is None or container.status != "running":
                raise NotFound("not running")
            container.pause()
        except (APIError, NotFound) as exc:
            log.warning("pausing a sandbox failed %s", kv(user=slot.user_id, error=exc))
            return False
        return True

    def resume(self, slot: AgentSlot) -> None:
        container = self._find(slot)
        if container is not None and container.status == "paused":
            self._unpause(container)

    def progress(self, slot: AgentSlot) -> Progress:
        container = self._find(slot)
        if container is None:
            return Progress(failed="the container was removed while starting")
        if container.status not in ("running", "created", "restarting"):
            return Progress(failed=f"the container exited ({container.status})")
        return Progress()

    def start_failed(self, slot: AgentSlot) -> dict[str, str]:
        container = self._find(slot)
        try:
            logs = container.logs(tail=20).decode(errors="replace").strip() if container is not None else ""
        except DockerException:
            logs = ""
        return {"container": self.sandbox_name(slot.user_id), "logs": logs}

    # --- Docker helpers -----------------------------------------------------------------------
    def _create(self, user: SandboxUser, image_id: str, build: str) -> Container:
        identity = SandboxIdentity.of(self.directories, user)
        spec = container_spec(
            instance=self.instance,
            plan=user.plan,
            image=self.image(user),
            image_id=image_id,
            agent_build=build,
            sandbox_uid=identity.uid,
            sandbox_gid=identity.gid,
            extra_gids=identity.extra_gids,
            network=self.settings.network,
            limits=self.limits.for_user(user.cpus, user.memory_mb),
            agent_dir=self.layout.agent_current,
            home_dir=self.layout.home_dir(user.user_id),
            config_path=self.layout.agent_config_path(user.user_id),
            lease_path=self.layout.lease_path(user.user_id),
            ca_bundle=self.ca_bundle(),
            runtime=self.settings.runtime,
        )
        try:
            return self._create_from(spec)
        except APIError as exc:
            if exc.status_code != 409:
                raise
        # The name is taken: a container this slot did not know (e.g. one created by a crashed
        # orchestrator between `create` and its bookkeeping). Ours by label: replace it.
        self._remove(self.engine.containers.get(spec.name))
        return self._create_from(spec)

    def _create_from(self, spec: ContainerSpec) -> Container:
        """Through the low-level API: docker-py's `containers.create` cannot mask paths."""
        api = self.engine.api
        created = api.create_container(host_config=spec.host_config(api), **spec.create_container_kwargs())
        return self.engine.containers.get(created["Id"])

    def _unpause(self, container: Container) -> None:
        try:
            container.unpause()
        except NotFound:
            pass
        except APIError as exc:  # e.g. thawed by someone else meanwhile: the state says
            log.warning("unpausing a sandbox failed %s", kv(container=container.short_id, error=exc.explanation))
        container.reload()

    def _find(self, slot: AgentSlot) -> Container | None:
        for key in (slot.sandbox_id, container_name(self.instance, slot.user_id)):
            if key is None:
                continue
            try:
                return self.engine.containers.get(key)
            except NotFound:
                continue
        return None

    def _managed_containers(self) -> list[Container]:
        filters = {"label": [f"{LABEL_MANAGED}={MANAGED_VALUE}", f"{LABEL_INSTANCE}={self.instance}"]}
        return self.engine.containers.list(all=True, filters=filters)

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except NotFound:
            pass

    def _image_id(self, user: SandboxUser) -> str:
        reference = self.image(user)
        now = time.monotonic()
        known = self._images.get(reference)
        if known is not None and now - known[1] < IMAGE_RECHECK_S:
            return known[0]
        try:
            image = self.engine.images.get(reference)
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


class DockerBackend(LifecycleEngine):
    """The docker backend: the lifecycle engine on `DockerDriver`."""

    def __init__(
        self, settings: SandboxSettings, directories: UserDirectories, deployment: AgentDeployment, *,
        known_user: Callable[[int], bool], client: docker.DockerClient | None = None,
    ) -> None:  # fmt: skip
        self.client = client or docker.from_env(timeout=60, max_pool_size=32)
        self.driver: DockerDriver = DockerDriver(settings, directories, deployment, self.client)
        self.driver.slot_ids = lambda: [s.user_id for s in self._slots.all() if s.sandbox_id is not None]
        super().__init__(self.driver, settings, directories, deployment, known_user=known_user)
        self.instance = self.driver.instance

    def peer_container(self, user_id: int) -> str | None:
        """The container whose processes are the user's sandbox at the other end of a socket
        when the uid says nothing (runsc: `sandbox_peer`); None under runc. For the egress
        proxy, which also takes the sandbox's uid (a user on the process backend)."""
        slot = self._slots.get(user_id)
        return slot.sandbox_id if slot is not None and self.settings.runtime == "runsc" else None
