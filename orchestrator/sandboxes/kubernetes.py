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

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from orchestrator.log import kv
from orchestrator.sandboxes.agent_calls import sandbox_unavailable
from orchestrator.sandboxes.agent_deploy import AgentDeployment, AgentRelease
from orchestrator.sandboxes.agent_launch import AgentLaunch
from orchestrator.sandboxes.base import SandboxStatus, SandboxUser, image_of
from orchestrator.sandboxes.docker_spec import Limits, instance_id
from orchestrator.sandboxes.kubernetes_forward import PodPortForwarder
from orchestrator.sandboxes.kubernetes_spec import (
    ANNOTATION_BUILD,
    ANNOTATION_PLAN,
    CONTAINER,
    STOP_GRACE_S,
    DataVolume,
    DesiredPod,
    Requests,
    network_policy,
    observed_pod,
    pod_manifest,
    pod_name,
    pod_outdated,
    pod_problem,
    pod_state,
    selector,
    user_of,
)
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState
from orchestrator.sandboxes.lifecycle_engine import LifecycleEngine
from orchestrator.sandboxes.sandbox_driver import Found, Inspection, Progress, SandboxDriver, SandboxIdentity, Wanted
from orchestrator.sandboxes.slots import AgentSlot
from orchestrator.settings import Settings
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable

log = logging.getLogger(__name__)

API_TIMEOUT_S = 15.0  # one request to the API server
POLL_S = 0.25  # how often a starting pod's status is read
GONE_TIMEOUT_S = 60.0  # a deleted pod must be gone before its name is used again
# Deleting a pod whose agent must not go on (stalled, failed to start, an unknown user's): the
# shortest grace that still lets the kubelet confirm its containers are dead. With 0 the API
# object goes at once while its container may still run, and a new pod of the same name could
# run beside it on the same user's files.
KILL_GRACE_S = 1
LOG_TAIL_MAX_BYTES = 16 * 1024  # of a failed pod's log (its last 20 lines), read on a failed start


def kube_configuration(settings: Settings) -> k8s.Configuration:
    """The API server and credentials: ORCH_K8S_KUBECONFIG, else the pod's service account
    when running in a cluster, else $KUBECONFIG or ~/.kube/config."""
    configuration = k8s.Configuration()
    if settings.k8s_kubeconfig is not None:
        k8s_config.load_kube_config(config_file=str(settings.k8s_kubeconfig), client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)
    else:
        k8s_config.load_kube_config(client_configuration=configuration)
    return configuration


def cluster_problem(settings: Settings, timeout: float = 5.0) -> str | None:
    """None when the cluster answers and the namespace exists, else why not (for start-up)."""
    try:
        api = k8s.ApiClient(kube_configuration(settings))
    except (k8s_config.ConfigException, OSError, ValueError) as exc:
        return f"no Kubernetes configuration: {exc}"
    try:
        k8s.CoreV1Api(api).list_namespaced_pod(settings.k8s_namespace, limit=1, _request_timeout=timeout)
        return None
    except ApiException as exc:
        return f"the Kubernetes API answered {exc.status} {exc.reason} for namespace {settings.k8s_namespace}"
    except (HTTPError, OSError) as exc:
        return f"the Kubernetes API does not answer: {exc}"
    finally:
        api.close()


class KubernetesDriver(SandboxDriver):
    """The verbs of the lifecycle engine on the Kubernetes API. The slot's `sandbox_id` is the
    pod's uid, its `image` the image reference. Kubernetes has no freezer in its API, and a pod
    is never restarted in place: it is created again."""

    name = "kubernetes"
    api_name = "the Kubernetes API"
    api_errors: tuple[type[BaseException], ...] = (ApiException, HTTPError, OSError)
    ready_poll_s = (POLL_S, POLL_S)
    progress_every_s = 0.0  # each check reads the pod

    def __init__(
        self, settings: Settings, directories: UserDirectories, deployment: AgentDeployment, configuration: k8s.Configuration
    ) -> None:
        super().__init__(settings, directories, deployment)
        self.namespace = settings.k8s_namespace
        self.configuration = configuration
        self.api = k8s.ApiClient(self.configuration)
        self.core = k8s.CoreV1Api(self.api)
        self.instance = instance_id(self.layout.root)
        self.data = DataVolume(self.layout.root, settings.k8s_data_pvc)
        self.limits = Limits(settings.sandbox_cpus, settings.sandbox_memory_mb, settings.sandbox_pids)
        self.requests = Requests(
            settings.k8s_cpu_request or settings.sandbox_cpus, settings.k8s_memory_request_mb or settings.sandbox_memory_mb
        )
        self._policy_made = False

    def launch_options(self) -> dict[str, Any]:
        return {
            "listen_port": self.settings.k8s_agent_port,
            "egress_reachable": self.data.claim is None,  # the egress socket is the node's own
            "host_kernel": self.settings.k8s_runtime_class is None,  # e.g. gVisor's: no fd passing
        }

    def api_error(self, exc: BaseException) -> str:
        return _api_error(exc)

    def close(self) -> None:
        self.api.close()

    # --- facts ------------------------------------------------------------------------------
    def wanted(self, user: SandboxUser) -> Wanted:
        desired = DesiredPod(
            user.plan.plan_hash, image_of(user, self.settings.sandbox_image), self.deployment.build,
            self.settings.k8s_runtime_class,
        )  # fmt: skip
        return Wanted(desired.plan_hash, desired.image, desired.agent_build, desired)

    def wanted_now(self, user: SandboxUser) -> tuple[str, str | None] | None:
        return user.plan.plan_hash, image_of(user, self.settings.sandbox_image)

    def inspect(self, slot: AgentSlot, wanted: Wanted | None) -> Inspection:
        pod = self._read(self.sandbox_name(slot.user_id))
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
            self._ensure_network_policy()
            self._policy_made = True
        found = []
        for pod in self._managed_pods():
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
        self._delete(found.name, grace_s=KILL_GRACE_S)

    def client(self, slot: AgentSlot, token: str) -> AgentClient:
        forwarder = PodPortForwarder(self.configuration, self.namespace, self.sandbox_name(slot.user_id), self.settings.k8s_agent_port)
        return AgentClient(forwarder.where, token, connector=forwarder, answer_limits=self.answer_limits)

    def create(self, slot: AgentSlot, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        name = self.sandbox_name(user.user_id)
        self._wait_gone(slot, name)
        try:
            created = self.core.create_namespaced_pod(
                self.namespace, self._manifest(user, release.build), _request_timeout=API_TIMEOUT_S, _preload_content=False
            )
        except ApiException as exc:
            raise sandbox_unavailable(
                user.user_id, f"the Kubernetes API refused to create pod {name}: {_api_error(exc)}"
            ) from None
        slot.sandbox_id = str(json.loads(created.data)["metadata"]["uid"])

    def remove(self, slot: AgentSlot, seen: Inspection | None, *, kill: bool) -> None:
        # Killed: the shortest grace that still lets the kubelet confirm its containers are dead.
        self._delete(self.sandbox_name(slot.user_id), grace_s=KILL_GRACE_S if kill else STOP_GRACE_S)

    def stop(self, slot: AgentSlot, reason: str) -> None:
        if slot.stopped:
            return
        name = self.sandbox_name(slot.user_id)
        log.info("deleting a sandbox pod %s", kv(user=slot.user_id, pod=name, reason=reason))
        self._delete(name, grace_s=STOP_GRACE_S)

    def progress(self, slot: AgentSlot) -> Progress:
        pod = self._read(self.sandbox_name(slot.user_id))
        if pod is None:
            return Progress(failed="its pod was deleted while starting")
        problem = pod_problem(pod, slot.image or self.settings.sandbox_image)
        if problem is not None and not problem.waits:
            return Progress(failed=problem.message)
        return Progress(
            waiting_for=problem.message if problem is not None else None, answers=observed_pod(pod).container_running
        )  # fmt: skip

    def refused_for_good(self, error: AgentUnavailable) -> bool:
        return "refused to port-forward" in error.message or "rejected the orchestrator" in error.message

    def start_failed(self, slot: AgentSlot) -> dict[str, str]:
        name = self.sandbox_name(slot.user_id)
        try:
            # None, not "", for a pod that never got a node (an unschedulable one).
            logs = (self.core.read_namespaced_pod_log(
                name, self.namespace, container=CONTAINER, tail_lines=20, limit_bytes=LOG_TAIL_MAX_BYTES,
                _request_timeout=API_TIMEOUT_S,
            ) or "").strip()  # fmt: skip
        except (ApiException, HTTPError, OSError):
            logs = ""
        try:  # nothing of it is worth keeping but its logs (above): the next call starts afresh
            self._delete(name, grace_s=KILL_GRACE_S)
        except (ApiException, HTTPError, OSError):
            pass
        return {"pod": name, "logs": logs}

    # --- API helpers ------------------------------------------------------------------------
    def _ensure_network_policy(self) -> None:
        policy = network_policy(self.instance)
        try:
            k8s.NetworkingV1Api(self.api).create_namespaced_network_policy(
                self.namespace, policy, _request_timeout=API_TIMEOUT_S
            )
            log.info("created the sandboxes' NetworkPolicy %s", kv(name=policy["metadata"]["name"], namespace=self.namespace))
        except ApiException as exc:
            if exc.status == 409:
                return  # there already
            # Not fatal: it is effective only with a policy-enforcing network plugin anyway.
            log.warning(
                "could not create the sandboxes' NetworkPolicy %s",
                kv(name=policy["metadata"]["name"], status=exc.status, reason=exc.reason),
            )

    def _manifest(self, user: SandboxUser, build: str) -> dict[str, Any]:
        identity = SandboxIdentity.of(self.directories, user)
        return pod_manifest(
            instance=self.instance,
            plan=user.plan,
            image=image_of(user, self.settings.sandbox_image),
            pull_policy=self.settings.k8s_image_pull_policy,
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
            tolerations=[t.manifest() for t in self.settings.k8s_tolerations],
            runtime_class=self.settings.k8s_runtime_class,
        )

    def ca_bundle(self) -> Path | None:
        """The node's CA bundle, when egress reaches the pod at all (a hostPath data volume: the
        pod is on the orchestrator's node)."""
        return super().ca_bundle() if self.data.claim is None else None

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            answer = self.core.read_namespaced_pod(
                name, self.namespace, _request_timeout=API_TIMEOUT_S, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(answer.data)

    def _managed_pods(self) -> list[dict[str, Any]]:
        answer = self.core.list_namespaced_pod(
            self.namespace, label_selector=selector(self.instance), _request_timeout=API_TIMEOUT_S, _preload_content=False
        )
        return list(json.loads(answer.data).get("items") or [])

    def _delete(self, name: str, *, grace_s: int) -> None:
        try:
            self.core.delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=grace_s, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _wait_gone(self, slot: AgentSlot, name: str) -> None:
        """A pod's name is free again only once it is gone (a deleted pod terminates first)."""
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while True:
            pod = self._read(name)
            if pod is None:
                return
            deleting = (pod.get("metadata") or {}).get("deletionTimestamp") is not None
            phase = (pod.get("status") or {}).get("phase")
            # Once its containers ended, only the kubelet's cleanup round keeps the object
            # (measured: ~8 s after the agent exited): removed at once, as nothing runs.
            ended = phase in ("Succeeded", "Failed")
            if not deleting or ended:
                if not deleting and phase in ("Pending", "Running"):
                    # A live pod we did not decide to replace (created meanwhile by another
                    # orchestrator of the same data dir?): replaced all the same, as ours.
                    log.warning("replacing a sandbox pod this slot did not know %s", kv(user=slot.user_id, pod=name))
                self._delete(name, grace_s=0 if ended else STOP_GRACE_S)
            if time.monotonic() >= deadline:
                raise sandbox_unavailable(slot.user_id, f"its previous pod {name} did not terminate within {GONE_TIMEOUT_S:g} s")
            time.sleep(POLL_S)



class KubernetesBackend(LifecycleEngine):
    """The kubernetes backend: the lifecycle engine on `KubernetesDriver`."""

    def __init__(
        self, settings: Settings, directories: UserDirectories, deployment: AgentDeployment, *,
        known_user: Callable[[int], bool], configuration: k8s.Configuration | None = None,
    ) -> None:  # fmt: skip
        configuration = configuration or kube_configuration(settings)
        self.driver: KubernetesDriver = KubernetesDriver(settings, directories, deployment, configuration)
        super().__init__(self.driver, settings, directories, deployment, known_user=known_user)
        self.namespace, self.data, self.configuration = self.driver.namespace, self.driver.data, self.driver.configuration
        self.instance = self.driver.instance

    @property
    def cluster(self) -> str:
        return self.configuration.host


def _api_error(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return repr(exc)
