"""The kubernetes driver of the lifecycle engine (`lifecycle_engine.py`): one pod per user in
`ORCH_K8S_NAMESPACE`, built from the mount plan (`kubernetes_spec.pod_manifest`), its agent
reached through the Kubernetes API's port-forward (`kubernetes_forward`), never a pod IP.

- A pod's name taken on the API server is waited for (a deleted pod terminates first), never
  doubled. The first listing makes the sandboxes' NetworkPolicy exist.
- Idle pods are deleted (the data stays on the data volume; the next call creates a pod
  again). Pods are never paused nor restarted in place: Kubernetes has no freezer in its API.
- A pod that will not become ready says why (image missing, unschedulable, OOMKilled, the
  agent exited) as `sandbox_unavailable`, from the pod's own status, not after a timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from orchestrator.log import kv
from orchestrator.sandboxes.agent_calls import sandbox_unavailable
from orchestrator.sandboxes.agent_deploy import AgentDeployment, AgentRelease
from orchestrator.sandboxes.agent_launch import AgentLaunch
from orchestrator.sandboxes.base import SandboxStatus, SandboxUser
from orchestrator.sandboxes.kubernetes_api import API_ERRORS, POLL_S, PodApi, api_error, kube_configuration
from orchestrator.sandboxes.kubernetes_forward import PodPortForwarder
from orchestrator.sandboxes.kubernetes_spec import (
    ANNOTATION_BUILD,
    ANNOTATION_PLAN,
    STOP_GRACE_S,
    DataVolume,
    DesiredPod,
    Requests,
    observed_pod,
    pod_manifest,
    pod_name,
    pod_outdated,
    pod_problem,
    pod_state,
    user_of,
)
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState
from orchestrator.sandboxes.lifecycle_engine import LifecycleEngine
from orchestrator.sandboxes.sandbox_driver import Found, Inspection, Progress, SandboxDriver, SandboxIdentity, Wanted
from orchestrator.sandboxes.slots import AgentSlot
from orchestrator.settings import SandboxSettings
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable

log = logging.getLogger(__name__)

GONE_TIMEOUT_S = 60.0  # a deleted pod must be gone before its name is used again
# Deleting a pod whose agent must not go on (stalled, failed to start, an unknown user's): the
# shortest grace that still lets the kubelet confirm its containers are dead. With 0 the API
# object goes at once while its container may still run, and a new pod of the same name could
# run beside it on the same user's files.
KILL_GRACE_S = 1


class KubernetesDriver(SandboxDriver):
    """The verbs of the lifecycle engine on the Kubernetes API. The slot's `sandbox_id` is the
    pod's uid, its `image` the image reference. Kubernetes has no freezer in its API, and a pod
    is never restarted in place: it is created again."""

    name = "kubernetes"
    api_name = "the Kubernetes API"
    api_errors = API_ERRORS
    ready_poll_s = (POLL_S, POLL_S)
    progress_every_s = 0.0  # each check reads the pod

    def __init__(
        self, settings: SandboxSettings, directories: UserDirectories, deployment: AgentDeployment, configuration: k8s.Configuration
    ) -> None:
        super().__init__(settings, directories, deployment)
        self.namespace = settings.kubernetes.namespace
        self.configuration = configuration
        self.pods = PodApi(configuration, self.namespace, self.instance)
        self.data = DataVolume(self.layout.root, settings.kubernetes.data_pvc)
        self.requests = Requests(
            settings.kubernetes.cpu_request or settings.cpus, settings.kubernetes.memory_request_mb or settings.memory_mb
        )
        self._policy_made = False

    def launch_options(self) -> dict[str, Any]:
        return {
            "listen_port": self.settings.kubernetes.agent_port,
            "egress_reachable": self.data.claim is None,  # the egress socket is the node's own
            "host_kernel": self.settings.kubernetes.runtime_class is None,  # e.g. gVisor's: no fd passing
        }

    def api_error(self, exc: BaseException) -> str:
        return api_error(exc)

    def close(self) -> None:
        self.pods.close()

    # --- facts ------------------------------------------------------------------------------
    def wanted(self, user: SandboxUser) -> Wanted:
        desired = DesiredPod(
            user.plan.plan_hash, self.image(user), self.deployment.build,
            self.settings.kubernetes.runtime_class,
        )  # fmt: skip
        return Wanted(desired.plan_hash, desired.image, desired.agent_build, desired)

    def wanted_now(self, user: SandboxUser) -> tuple[str, str | None] | None:
        return user.plan.plan_hash, self.image(user)

    def inspect(self, slot: AgentSlot, wanted: Wanted | None) -> Inspection:
        pod = self.pods.read(self.sandbox_name(slot.user_id))
        if pod is None:
            return Inspection(SandboxState.ABSENT)
        observed = observed_pod(pod)
        gids = (pod.get("spec") or {}).get("securityContext", {}).get("supplementalGroups") or []
        return Inspection(
            pod_state(observed), wanted is not None and pod_outdated(observed, wanted.spec), observed.plan_hash,
            observed.image, observed.uid, frozenset(gids), pod,
        )  # fmt: skip

    def listed(self) -> list[Found]:
        """The pods of this instance; the first listing also makes the sandboxes' NetworkPolicy exist."""
        if not self._policy_made:
            self.pods.ensure_network_policy()
            self._policy_made = True
        found = []
        for pod in self.pods.listed():
            metadata = pod.get("metadata") or {}
            observed = observed_pod(pod)
            running = not observed.deleting and observed.phase in ("Pending", "Running")
            found.append(Found(user_of(metadata.get("labels")), str(metadata.get("name")), running, pod))
        return found

    def status(self, found: Found, slot: AgentSlot) -> SandboxStatus:
        pod = found.handle
        metadata = pod.get("metadata") or {}
        observed = observed_pod(pod)
        assert found.user_id is not None
        state = "running" if observed.container_running and not observed.deleting else (
            "starting" if observed.phase == "Pending" and not observed.deleting else "stopped"
        )
        annotations = metadata.get("annotations") or {}
        return SandboxStatus(
            user_id=found.user_id,
            backend=self.name,
            state=state,
            plan_hash=annotations.get(ANNOTATION_PLAN),
            agent_build=slot.running_build or annotations.get(ANNOTATION_BUILD),
            busy=slot.count.in_flight,
            detail={
                "pod": metadata.get("name"),
                "pod_uid": observed.uid,
                "namespace": self.namespace,
                "node": observed.node,
                "phase": observed.phase,
            },
            since=(pod.get("status") or {}).get("startTime"),
        )

    def sandbox_name(self, user_id: int) -> str:
        return pod_name(self.instance, user_id)

    # --- verbs ------------------------------------------------------------------------------
    def adopt(self, slot: AgentSlot, found: Found) -> None:
        slot.sandbox_id = observed_pod(found.handle).uid

    def discard(self, found: Found) -> None:
        self.pods.delete(found.name, grace_s=KILL_GRACE_S)

    def client(self, slot: AgentSlot, token: str) -> AgentClient:
        forwarder = PodPortForwarder(self.configuration, self.namespace, self.sandbox_name(slot.user_id), self.settings.kubernetes.agent_port)
        return AgentClient(forwarder.where, token, connector=forwarder, answer_limits=self.answer_limits)

    def create(self, slot: AgentSlot, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        name = self.sandbox_name(user.user_id)
        if not self.pods.free_name(name, timeout_s=GONE_TIMEOUT_S, user_id=user.user_id):
            raise sandbox_unavailable(user.user_id, f"its previous pod {name} did not terminate within {GONE_TIMEOUT_S:g} s")
        try:
            created = self.pods.create(self._manifest(user, release.build))
        except ApiException as exc:
            raise sandbox_unavailable(
                user.user_id, f"the Kubernetes API refused to create pod {name}: {api_error(exc)}"
            ) from None
        slot.sandbox_id = str(created["metadata"]["uid"])

    def remove(self, slot: AgentSlot, seen: Inspection | None, *, kill: bool) -> None:
        # Killed: the shortest grace that still lets the kubelet confirm its containers are dead.
        self.pods.delete(self.sandbox_name(slot.user_id), grace_s=KILL_GRACE_S if kill else STOP_GRACE_S)

    def stop(self, slot: AgentSlot, reason: str) -> None:
        if slot.stopped:
            return
        name = self.sandbox_name(slot.user_id)
        log.info("deleting a sandbox pod %s", kv(user=slot.user_id, pod=name, reason=reason))
        self.pods.delete(name, grace_s=STOP_GRACE_S)

    def progress(self, slot: AgentSlot) -> Progress:
        pod = self.pods.read(self.sandbox_name(slot.user_id))
        if pod is None:
            return Progress(failed="its pod was deleted while starting")
        problem = pod_problem(pod, slot.image or self.settings.image)
        if problem is not None and not problem.waits:
            return Progress(failed=problem.message)
        return Progress(
            waiting_for=problem.message if problem is not None else None, answers=observed_pod(pod).container_running
        )  # fmt: skip

    def refused_for_good(self, error: AgentUnavailable) -> bool:
        return "refused to port-forward" in error.message or "rejected the orchestrator" in error.message

    def start_failed(self, slot: AgentSlot) -> dict[str, str]:
        name = self.sandbox_name(slot.user_id)
        logs = self.pods.log_tail(name)
        try:  # nothing of it is worth keeping but its logs (above): the next call starts afresh
            self.pods.delete(name, grace_s=KILL_GRACE_S)
        except API_ERRORS:
            pass
        return {"pod": name, "logs": logs}

    # --- what a pod looks like --------------------------------------------------------------
    def _manifest(self, user: SandboxUser, build: str) -> dict[str, Any]:
        identity = SandboxIdentity.of(self.directories, user)
        return pod_manifest(
            instance=self.instance,
            plan=user.plan,
            image=self.image(user),
            pull_policy=self.settings.kubernetes.image_pull_policy,
            agent_build=build,
            data=self.data,
            sandbox_uid=identity.uid,
            sandbox_gid=identity.gid,
            extra_gids=identity.extra_gids,
            limits=(limits := self.limits.for_user(user.cpus, user.memory_mb)),
            # Never more reserved than the user's limit (a lowered override).
            requests=Requests(min(self.requests.cpus, limits.cpus), min(self.requests.memory_mb, limits.memory_mb)),
            agent_dir=self.layout.agent_current,
            home_dir=self.layout.home_dir(user.user_id),
            config_path=self.layout.agent_config_path(user.user_id),
            ca_bundle=self.ca_bundle(),
            tolerations=[t.manifest() for t in self.settings.kubernetes.tolerations],
            runtime_class=self.settings.kubernetes.runtime_class,
        )

    def ca_bundle(self) -> Path | None:
        """The node's CA bundle, when egress reaches the pod at all (a hostPath data volume: the
        pod is on the orchestrator's node)."""
        return super().ca_bundle() if self.data.claim is None else None


class KubernetesBackend(LifecycleEngine):
    """The kubernetes backend: the lifecycle engine on `KubernetesDriver`."""

    def __init__(
        self, settings: SandboxSettings, directories: UserDirectories, deployment: AgentDeployment, *,
        known_user: Callable[[int], bool], configuration: k8s.Configuration | None = None,
    ) -> None:  # fmt: skip
        configuration = configuration or kube_configuration(settings.kubernetes)
        self.driver: KubernetesDriver = KubernetesDriver(settings, directories, deployment, configuration)
        super().__init__(self.driver, settings, directories, deployment, known_user=known_user)
        self.namespace, self.data, self.configuration = self.driver.namespace, self.driver.data, self.driver.configuration
        self.instance = self.driver.instance

    @property
    def cluster(self) -> str:
        return self.configuration.host
