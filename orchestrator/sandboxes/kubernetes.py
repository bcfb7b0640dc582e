"""The kubernetes backend: one pod per user in `ORCH_K8S_NAMESPACE`, built from the mount plan
(`kubernetes_spec.pod_manifest`), its agent reached through the Kubernetes API's
port-forward (`kubernetes_forward`), never through a pod IP.

- The warm path of a tool call touches no API: the user's slot caches the pod's plan hash,
  image and agent BUILD, and the call goes to the agent over a pooled forwarded connection.
  The slow path (first call, a drift, a dead agent, a deleted or evicted pod) reads the pod
  and applies `decide_pod()`.
- A per-user lock makes concurrent first calls create exactly one pod (and a name taken on
  the API server is waited for, never doubled).
- On start, this orchestrator's pods (label `instance` = its data dir) are adopted, those of
  users it does not know are deleted, and the sandboxes' NetworkPolicy is made to exist.
- Idle pods are deleted (the data stays on the data volume; the next call creates a pod
  again). Pods are not paused: Kubernetes has no freezer in its API.
- A pod that will not become ready says why (image missing, unschedulable, OOMKilled, the
  agent exited) as `sandbox_unavailable`, from the pod's own status, not after a timeout.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from orchestrator import metrics
from orchestrator.log import kv
from orchestrator.sandboxes.agent_calls import HEALTH_TIMEOUT_S, answer_limits, sandbox_unavailable
from orchestrator.sandboxes.agent_deploy import AgentDeployment
from orchestrator.sandboxes.agent_launch import prepare_agent_launch
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
from orchestrator.sandboxes.docker_spec import Limits, instance_id
from orchestrator.sandboxes.kubernetes_forward import PodPortForwarder
from orchestrator.sandboxes.slots import AgentSlot, SlotTable, live_agent, reconnect
from orchestrator.sandboxes.kubernetes_spec import (
    ANNOTATION_BUILD,
    ANNOTATION_PLAN,
    CONTAINER,
    STOP_GRACE_S,
    DataVolume,
    DesiredPod,
    ObservedPod,
    PodAction,
    Requests,
    decide_pod,
    network_policy,
    observed_pod,
    pod_manifest,
    pod_name,
    pod_problem,
    selector,
    user_of,
)
from orchestrator.settings import Settings
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable

log = logging.getLogger(__name__)

PARALLEL_STARTS = 4  # pod creations waited for at once
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


@dataclass
class _Slot(AgentSlot):
    """One user's pod as this orchestrator knows it (`AgentSlot`: its agent, its calls)."""

    pod_uid: str | None = None
    image: str | None = None
    stopped: bool = True  # no pod of ours runs (never started, idle-stopped, or asked)


class KubernetesBackend:
    name = "kubernetes"

    def __init__(
        self,
        settings: Settings,
        directories: UserDirectories,
        deployment: AgentDeployment,
        *,
        known_user: Callable[[int], bool],
        configuration: k8s.Configuration | None = None,
    ) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.directories = directories
        self.deployment = deployment
        self.known_user = known_user
        self.namespace = settings.k8s_namespace
        self.configuration = configuration or kube_configuration(settings)
        self.api = k8s.ApiClient(self.configuration)
        self.core = k8s.CoreV1Api(self.api)
        self.instance = instance_id(self.layout.root)
        self.data = DataVolume(self.layout.root, settings.k8s_data_pvc)
        self.limits = Limits(settings.sandbox_cpus, settings.sandbox_memory_mb, settings.sandbox_pids)
        self.requests = Requests(
            settings.k8s_cpu_request or settings.sandbox_cpus, settings.k8s_memory_request_mb or settings.sandbox_memory_mb
        )
        self._slots: SlotTable[_Slot] = SlotTable(_Slot)
        self._starts = threading.BoundedSemaphore(PARALLEL_STARTS)
        self._answer_limits = answer_limits(settings)
        self._adopted = False
        self._adopt_lock = threading.Lock()

    @property
    def cluster(self) -> str:
        return self.configuration.host

    # --- the backend's own lifecycle ------------------------------------------------------
    def close(self) -> None:
        """Drop the agents' clients; pods keep running and are adopted by the next start."""
        self._slots.drop_agents()
        self.api.close()

    def adopt(self) -> list[int]:
        """Once: make the sandboxes' NetworkPolicy exist, take over the pods labelled with this
        instance, delete those of users this orchestrator does not know. Returns the adopted
        users. An API server that does not answer leaves it for the next call."""
        with self._adopt_lock:
            if self._adopted:
                return []
            self._ensure_network_policy()
            adopted = []
            for pod in self._managed_pods():
                metadata = pod.get("metadata") or {}
                user_id = user_of(metadata.get("labels"))
                if user_id is None or not self.known_user(user_id):
                    log.warning("deleting the sandbox pod of an unknown user %s", kv(pod=metadata.get("name"), user=user_id))
                    self._delete(str(metadata.get("name")), grace_s=KILL_GRACE_S)
                    continue
                observed = observed_pod(pod)
                slot = self._slot(user_id)
                with slot.lock:
                    slot.pod_uid = observed.uid
                    slot.count.touch()
                    slot.count.note_processes(None, started_for_s=self.settings.process_max_runtime_s)
                    slot.stopped = observed.deleting or observed.phase not in ("Pending", "Running")
                adopted.append(user_id)
                log.info("adopted a sandbox pod %s", kv(user=user_id, pod=metadata.get("name"), phase=observed.phase))
            self._adopted = True
            return adopted

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

    # --- SandboxBackend -------------------------------------------------------------------
    def ensure(self, user: SandboxUser) -> LiveAgent:
        try:
            self.adopt()
        except (ApiException, HTTPError, OSError) as exc:
            raise sandbox_unavailable(user.user_id, f"the Kubernetes API does not answer: {_api_error(exc)}") from None
        slot = self._slot(user.user_id)
        with slot.lock:
            try:
                self._ensure_locked(slot, user)
            except (ApiException, HTTPError, OSError) as exc:
                slot.forget_agent()
                raise sandbox_unavailable(user.user_id, f"the Kubernetes API refused: {_api_error(exc)}") from None
            assert slot.live is not None
            slot.count.touch()
            return slot.live

    def warm(self, user: SandboxUser) -> LiveAgent | None:
        if not self._adopted:
            return None
        slot = self._slots.get(user.user_id)
        if slot is None or not slot.lock.acquire(blocking=False):
            return None
        try:
            if (
                slot.live is None
                or slot.stalled
                or slot.forgotten
                or slot.plan_hash != user.plan.plan_hash
                or slot.image != image_of(user, self.settings.sandbox_image)
                or slot.running_build != self.deployment.build
            ):
                return None
            return slot.live
        finally:
            slot.lock.release()

    def resume(self, user: SandboxUser) -> LiveAgent | None:
        return None  # pods are never paused

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
        for pod in self._managed_pods():
            metadata = pod.get("metadata") or {}
            user_id = user_of(metadata.get("labels"))
            if user_id is None:
                continue
            observed = observed_pod(pod)
            slot = self._slot(user_id)
            state = "running" if observed.container_running and not observed.deleting else (
                "starting" if observed.phase == "Pending" and not observed.deleting else "stopped"
            )
            annotations = metadata.get("annotations") or {}
            statuses.append(
                SandboxStatus(
                    user_id=user_id,
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
            )
        return sorted(statuses, key=lambda s: s.user_id)

    # --- the slow path ----------------------------------------------------------------------
    def _ensure_locked(self, slot: _Slot, user: SandboxUser) -> None:
        desired = DesiredPod(
            user.plan.plan_hash, image_of(user, self.settings.sandbox_image), self.deployment.build, self.settings.k8s_runtime_class
        )
        name = pod_name(self.instance, user.user_id)
        if slot.stalled:
            log.warning("replacing a stalled sandbox pod %s", kv(user=user.user_id, pod=name))
            slot.forget_agent()
            self._delete(name, grace_s=KILL_GRACE_S)
            slot.stalled = False
        elif slot.forgotten:
            slot.forget_agent()
        if (
            slot.live is not None
            and slot.plan_hash == desired.plan_hash
            and slot.image == desired.image
            and slot.running_build == desired.agent_build
        ):
            return
        pod = self._read(name)
        observed = observed_pod(pod) if pod is not None else None
        if observed is not None and observed.container_running and not observed.deleting and slot.live is None:
            if not self._reconnect(slot, name, observed):
                # Running but its agent does not answer (or its token is gone): replace it.
                observed = ObservedPod(observed.uid, "Failed", False, False, observed.plan_hash, observed.image)
                slot.count.note_processes(0)
        busy = slot.count.in_flight > 0 or runs_processes(slot.live, slot.count)
        if busy and pod is not None:  # a revoked group does not wait for the calls under way
            running_gids = set((pod.get("spec") or {}).get("securityContext", {}).get("supplementalGroups") or [])
            busy = not loses_group_access(running_gids - {self.directories.shared_gid}, user.plan.group_gids)
        action = decide_pod(observed, desired, running_build=slot.running_build, busy=busy)
        if action is PodAction.USE:
            assert observed is not None and slot.live is not None
            slot.plan_hash, slot.image, slot.pod_uid = observed.plan_hash, observed.image, observed.uid
            slot.stopped = False
            return
        log.info(
            "sandbox pod %s %s",
            action.value,
            kv(user=user.user_id, pod=name, phase=observed.phase if observed else None,
               plan_changed=observed is not None and observed.plan_hash != desired.plan_hash,
               running_build=slot.running_build, host_build=desired.agent_build),
        )  # fmt: skip
        slot.forget_agent()
        slot.count.note_processes(0)
        with self._starts:
            started = time.monotonic()
            if action is PodAction.WAIT:
                # Ours and current, but its agent is not up yet (adopted while pending, or a
                # start this orchestrator did not see through): started afresh, as its token
                # may be older than the one on disk.
                action = PodAction.RECREATE
            if action is PodAction.RECREATE:
                self._delete(name, grace_s=STOP_GRACE_S)
            self._wait_gone(slot, name)
            release = self.deployment.ensure()
            try:
                launch = prepare_agent_launch(
                    self.settings, self.directories, user, in_sandbox=True, parent_pid=None,
                    listen_port=self.settings.k8s_agent_port,
                    egress_reachable=self.data.claim is None,  # the egress socket is the node's own
                    host_kernel=self.settings.k8s_runtime_class is None,  # e.g. gVisor's: no fd passing
                )  # fmt: skip
            except (OSError, RuntimeError, UnsafeDirectory) as exc:
                raise sandbox_unavailable(user.user_id, f"preparing it failed: {exc}") from exc
            manifest = self._manifest(user, release.build)
            try:
                created = self.core.create_namespaced_pod(
                    self.namespace, manifest, _request_timeout=API_TIMEOUT_S, _preload_content=False
                )
            except ApiException as exc:
                raise sandbox_unavailable(
                    user.user_id, f"the Kubernetes API refused to create pod {name}: {_api_error(exc)}"
                ) from None
            slot.pod_uid = str(json.loads(created.data)["metadata"]["uid"])
            slot.plan_hash, slot.image, slot.stopped = desired.plan_hash, desired.image, False
            agent = self._agent_client(user.user_id, name, launch.token)
            self._wait_ready(slot, name, agent, launch.config.instance_id, launch.token)
            seconds = time.monotonic() - started
            log.info("sandbox pod ready %s", kv(user=user.user_id, pod=name, build=slot.running_build, seconds=round(seconds, 3)))
            metrics.observe_start(self.name, "cold", seconds)

    def _manifest(self, user: SandboxUser, build: str) -> dict[str, Any]:
        if self.directories.chown:
            uid = gid = self.directories.sandbox_uid(user.user_id)
            extra: tuple[int, ...] = (self.directories.shared_gid, *user.plan.group_gids)
        else:  # not root: the directories belong to us, so the sandbox runs as us
            uid, gid, extra = os.geteuid(), os.getegid(), ()
        return pod_manifest(
            instance=self.instance,
            plan=user.plan,
            image=image_of(user, self.settings.sandbox_image),
            pull_policy=self.settings.k8s_image_pull_policy,
            agent_build=build,
            data=self.data,
            sandbox_uid=uid,
            sandbox_gid=gid,
            extra_gids=extra,
            limits=self.limits,
            requests=self.requests,
            agent_dir=self.layout.agent_current,
            home_dir=self.layout.home_dir(user.user_id),
            config_path=self.layout.agent_config_path(user.user_id),
            ca_bundle=self._ca_bundle(),
            tolerations=[t.manifest() for t in self.settings.k8s_tolerations],
            runtime_class=self.settings.k8s_runtime_class,
        )

    def _ca_bundle(self) -> Path | None:
        """The node's CA bundle for pip and npm behind the egress proxy, when egress reaches
        the pod at all (a hostPath data volume: the pod is on the orchestrator's node)."""
        bundle = self.settings.egress_ca_bundle
        if self.settings.egress == "off" or self.data.claim is not None or not bundle.is_file():
            return None
        return bundle

    def _reconnect(self, slot: _Slot, name: str, observed: ObservedPod) -> bool:
        """The agent already running in the pod (`slots.reconnect`), through a forward to it.
        False: the caller replaces the pod."""
        if not reconnect(slot, self.directories, lambda token: self._agent_client(slot.user_id, name, token)):
            return False
        slot.pod_uid = observed.uid
        return True

    def _agent_client(self, user_id: int, name: str, token: str) -> AgentClient:
        forwarder = PodPortForwarder(self.configuration, self.namespace, name, self.settings.k8s_agent_port)
        return AgentClient(forwarder.where, token, connector=forwarder, answer_limits=self._answer_limits)

    def _wait_ready(self, slot: _Slot, name: str, agent: AgentClient, instance: str, token: str) -> None:
        """Ready = our agent (the instance id we wrote) answers /health through the forward.
        Meanwhile the pod's status is read: a problem that waiting will not solve fails the
        start at once, in its own words."""
        timeout = self.settings.sandbox_ready_timeout_s
        deadline = time.monotonic() + timeout
        last_problem: str | None = None
        while True:
            pod = self._read(name)
            if pod is None:
                self._fail_start(slot, name, agent, "its pod was deleted while starting")
            assert pod is not None
            problem = pod_problem(pod, slot.image or self.settings.sandbox_image)
            if problem is not None and not problem.waits:
                self._fail_start(slot, name, agent, problem.message)
            last_problem = problem.message if problem is not None else None
            if observed_pod(pod).container_running:
                try:
                    health = agent.health(timeout_s=HEALTH_TIMEOUT_S)
                    if health.instance_id == instance:
                        slot.running_build = health.build
                        slot.live = live_agent(slot, agent, token)
                        return
                except AgentUnavailable as exc:
                    if "refused to port-forward" in exc.message or "rejected the orchestrator" in exc.message:
                        self._fail_start(slot, name, agent, exc.message)
            if time.monotonic() >= deadline:
                why = last_problem or f"its agent did not answer /health within {timeout:g} s"
                self._fail_start(slot, name, agent, why)
            time.sleep(POLL_S)

    def _fail_start(self, slot: _Slot, name: str, agent: AgentClient, why: str) -> None:
        agent.close()
        try:
            # None, not "", for a pod that never got a node (an unschedulable one).
            logs = (self.core.read_namespaced_pod_log(
                name, self.namespace, container=CONTAINER, tail_lines=20, limit_bytes=LOG_TAIL_MAX_BYTES,
                _request_timeout=API_TIMEOUT_S,
            ) or "").strip()  # fmt: skip
        except (ApiException, HTTPError, OSError):
            logs = ""
        log.error("sandbox pod failed to start %s", kv(user=slot.user_id, pod=name, why=why, logs=logs))
        try:  # nothing of it is worth keeping but its logs (above): the next call starts afresh
            self._delete(name, grace_s=KILL_GRACE_S)
        except (ApiException, HTTPError, OSError):
            pass
        slot.stopped = True
        raise sandbox_unavailable(slot.user_id, f"it did not start: {why}", pod=name, logs=logs[-2000:])

    def _stop_locked(self, slot: _Slot, *, reason: str) -> None:
        slot.forget_agent()
        slot.count.note_processes(0)
        if slot.stopped:
            return
        slot.stopped = True
        name = pod_name(self.instance, slot.user_id)
        log.info("deleting a sandbox pod %s", kv(user=slot.user_id, pod=name, reason=reason))
        self._delete(name, grace_s=STOP_GRACE_S)

    # --- idleness ---------------------------------------------------------------------------
    def reap_idle(self, now: float | None = None) -> list[int]:
        """Delete the pods idle for `idle_timeout_s`; returns their users. Adopts first (once)."""
        try:
            self.adopt()
        except (ApiException, HTTPError, OSError) as exc:
            log.warning("the Kubernetes API does not answer; adoption waits %s", kv(error=_api_error(exc)))
            return []
        now = time.monotonic() if now is None else now
        slots = self._slots.all()
        stopped = []
        for slot in slots:
            if not slot.lock.acquire(blocking=False):
                continue
            try:
                if slot.stopped:
                    continue
                action = idle_action(
                    idle_s=now - slot.count.last_used,
                    in_flight=slot.count.in_flight,
                    paused=False,
                    has_running_processes=runs_processes(slot.live, slot.count),
                    pause_after_s=0.0,  # no pausing on kubernetes
                    idle_timeout_s=self.settings.idle_timeout_s,
                )
                if action is IdleAction.STOP:
                    try:
                        self._stop_locked(slot, reason="idle")
                    except (ApiException, HTTPError, OSError) as exc:
                        slot.stopped = False
                        log.warning("deleting an idle sandbox pod failed %s", kv(user=slot.user_id, error=_api_error(exc)))
                        continue
                    stopped.append(slot.user_id)
                    metrics.SANDBOX_IDLE_ACTIONS.labels(self.name, action.value).inc()
            finally:
                slot.lock.release()
        return stopped

    # --- API helpers ------------------------------------------------------------------------
    def _slot(self, user_id: int) -> _Slot:
        return self._slots.slot(user_id)

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

    def _wait_gone(self, slot: _Slot, name: str) -> None:
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


def _api_error(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return repr(exc)
