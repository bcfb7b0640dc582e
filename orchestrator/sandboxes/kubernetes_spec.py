"""The kubernetes backend's deciders: what a user's pod looks like, the NetworkPolicy of the
sandbox pods, what the pod that exists is to the lifecycle decision table, and what a failing pod's status says in
words. Pure: values in, values out (manifests are plain dicts, as the API takes them); no
cluster needed to test them. The counterpart of `docker_spec.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mounts.plan import Access, MountPlan
from orchestrator.sandboxes.docker_spec import Limits, container_name
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState

# Label keys (selectable: which pods are ours, whose) and annotation keys (values too long or
# with characters a label value may not hold: a plan hash is 64 hex digits, an image a reference).
PREFIX = "sandbox-orchestrator/"
LABEL_MANAGED = PREFIX + "managed"
LABEL_INSTANCE = PREFIX + "instance"
LABEL_USER = PREFIX + "user"
ANNOTATION_PLAN = PREFIX + "plan-hash"
ANNOTATION_IMAGE = PREFIX + "image"
ANNOTATION_BUILD = PREFIX + "agent-build"
MANAGED_VALUE = "sandbox"
CONTAINER = "sandbox"
ENTRYPOINT = "/usr/local/bin/sandbox-entrypoint"
DATA_VOLUME = "data"
RUN_VOLUME = "run"
CA_VOLUME = "ca-bundle"
RUN_SIZE = "16Mi"  # writable scratch on the read-only root (lock and pid files), as docker's tmpfs
STOP_GRACE_S = 5  # the agent's own shutdown takes up to 3 s


def pod_name(instance: str, user_id: int) -> str:
    """The same name as the docker backend's container (a DNS-1123 label)."""
    return container_name(instance, user_id)


def selector(instance: str) -> str:
    """The label selector of this orchestrator's sandbox pods."""
    return f"{LABEL_MANAGED}={MANAGED_VALUE},{LABEL_INSTANCE}={instance}"


@dataclass(frozen=True)
class DataVolume:
    """Where the data directory comes from: a hostPath of it on the node (one node), or a
    ReadWriteMany claim that holds it (several nodes). Every plan entry is a subPath of it."""

    root: Path
    claim: str | None = None

    def volume(self) -> dict[str, Any]:
        if self.claim is not None:
            return {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": self.claim}}
        return {"name": DATA_VOLUME, "hostPath": {"path": str(self.root), "type": "Directory"}}

    def describe(self) -> str:
        return f"persistentVolumeClaim {self.claim}" if self.claim is not None else f"hostPath {self.root}"

    def sub_path(self, host_path: Path) -> str:
        """The plan entry's path inside the volume; a plan entry outside the data directory
        cannot be mounted from it (every planned host path is inside: mounts/plan.py)."""
        try:
            relative = host_path.relative_to(self.root)
        except ValueError:
            raise ValueError(f"{host_path} is outside the data directory {self.root}") from None
        if not relative.parts or ".." in relative.parts:
            raise ValueError(f"{host_path} is not a directory inside {self.root}")
        return str(relative)


@dataclass(frozen=True)
class Requests:
    """What the scheduler reserves per sandbox pod (the limits are the docker backend's)."""

    cpus: float
    memory_mb: int


def quantity_cpu(cpus: float) -> str:
    return f"{max(1, round(cpus * 1000))}m"


def pod_manifest(
    *,
    instance: str,
    plan: MountPlan,
    image: str,
    pull_policy: str,
    agent_build: str,
    data: DataVolume,
    sandbox_uid: int,
    sandbox_gid: int,
    extra_gids: Sequence[int],
    limits: Limits,
    requests: Requests,
    agent_dir: Path,
    home_dir: Path,
    config_path: Path,
    ca_bundle: Path | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    runtime_class: str | None = None,
) -> dict[str, Any]:
    """The pod of `plan.user_id`: the plan's mounts as subPaths of the data volume at the same
    paths (tmp at /tmp), read-only where the plan says; the user's own uid and groups, no
    capabilities, no privilege escalation, a read-only root, the runtime's default seccomp
    profile; no service-account token, no service links; the agent started from the
    read-only agent mount. No secret is in here: the per-sandbox token is a file of the
    user's agent-secrets directory on the data volume, which only its gid may read."""
    name = pod_name(instance, plan.user_id)
    mounts = [
        {
            "name": DATA_VOLUME,
            "mountPath": str(m.sandbox_path),
            "subPath": data.sub_path(m.host_path),
            "readOnly": m.access is Access.READ_ONLY,
        }
        for m in plan.mounts
    ]
    mounts.append({"name": RUN_VOLUME, "mountPath": "/run"})
    volumes = [data.volume(), {"name": RUN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": RUN_SIZE}}]
    if ca_bundle is not None:
        # The node's trust store, read-only at the same path (docs/egress.md).
        volumes.append({"name": CA_VOLUME, "hostPath": {"path": str(ca_bundle), "type": "File"}})
        mounts.append({"name": CA_VOLUME, "mountPath": str(ca_bundle), "readOnly": True})
    probe = {"exec": {"command": [ENTRYPOINT, "--probe", "--config", str(config_path)]}, "timeoutSeconds": 5}
    container = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": ["--config", str(config_path)],
        "env": [
            {"name": "HOME", "value": str(home_dir)},
            {"name": "TMPDIR", "value": "/tmp"},
            {"name": "SANDBOX_AGENT_DIR", "value": str(agent_dir)},
        ],
        "volumeMounts": mounts,
        "resources": {
            "limits": {"cpu": quantity_cpu(limits.cpus), "memory": f"{limits.memory_mb}Mi"},
            "requests": {
                "cpu": quantity_cpu(min(requests.cpus, limits.cpus)),
                "memory": f"{min(requests.memory_mb, limits.memory_mb)}Mi",
            },
        },
        "securityContext": {
            "runAsUser": sandbox_uid,
            "runAsGroup": sandbox_gid,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        # Exec probes: a pod may have no IP an httpGet probe could dial. Sparse: each starts a
        # process in the sandbox; the orchestrator's own readiness is /health over the forward.
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 30, "periodSeconds": 30, "failureThreshold": 3},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {LABEL_MANAGED: MANAGED_VALUE, LABEL_INSTANCE: instance, LABEL_USER: str(plan.user_id)},
            "annotations": {ANNOTATION_PLAN: plan.plan_hash, ANNOTATION_IMAGE: image, ANNOTATION_BUILD: agent_build},
        },
        "spec": {
            "hostname": f"sandbox-{plan.user_id}",
            "restartPolicy": "Never",  # a dead agent is a failed pod, replaced by the next call
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            # The pod's pause process is PID 1 and reaps the zombies a user's commands leave
            # behind (docker's `init`).
            "shareProcessNamespace": True,
            "terminationGracePeriodSeconds": STOP_GRACE_S,
            "securityContext": {
                "runAsUser": sandbox_uid,
                "runAsGroup": sandbox_gid,
                "runAsNonRoot": True,
                # share/'s common gid and each group workspace's own gid: exactly the plan's groups.
                "supplementalGroups": list(extra_gids),
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            # Users' pods spread over the nodes (one node's loss or drain touches fewer users);
            # soft, so a single node or a full one still takes them.
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {LABEL_MANAGED: MANAGED_VALUE, LABEL_INSTANCE: instance}},
                }
            ],
            **({"tolerations": [dict(t) for t in tolerations]} if tolerations else {}),
            # e.g. gVisor's RuntimeClass: a user-space kernel between the sandbox and the node's.
            **({"runtimeClassName": runtime_class} if runtime_class else {}),
            "containers": [container],
            "volumes": volumes,
        },
    }


def network_policy(instance: str) -> dict[str, Any]:
    """Deny all ingress and egress of this orchestrator's sandbox pods. Effective only where
    the cluster's network plugin enforces NetworkPolicy; the agent is reached through the
    API's port-forward, which no policy blocks."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"orch-{instance}-sandboxes-deny-all"},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_MANAGED: MANAGED_VALUE, LABEL_INSTANCE: instance}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


# --- the pod that exists, as the lifecycle decision table sees it --------------------------


@dataclass(frozen=True)
class ObservedPod:
    """A pod as the API reports it."""

    uid: str
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    deleting: bool  # has a deletionTimestamp
    container_running: bool
    plan_hash: str | None
    image: str | None
    node: str | None = None
    runtime_class: str | None = None  # spec.runtimeClassName


@dataclass(frozen=True)
class DesiredPod:
    plan_hash: str
    image: str
    agent_build: str
    runtime_class: str | None = None  # ORCH_K8S_RUNTIME_CLASS: a pod of another class is outdated


def pod_state(observed: ObservedPod) -> SandboxState:
    """Pure: a pod as the lifecycle table sees it. There is no stopped pod to start again (an
    idle stop deletes it; the data stays on the data volume): one that ended, failed or is
    being deleted is replaced."""
    if observed.deleting or observed.phase in ("Succeeded", "Failed", "Unknown"):
        return SandboxState.ENDED
    return SandboxState.RUNNING if observed.container_running else SandboxState.STARTING


def pod_outdated(observed: ObservedPod, desired: DesiredPod) -> bool:
    return (
        observed.plan_hash != desired.plan_hash
        or observed.image != desired.image
        or observed.runtime_class != desired.runtime_class
    )


def observed_pod(pod: Mapping[str, Any]) -> ObservedPod:
    """An `ObservedPod` from a pod as the API serializes it (camelCase keys)."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    annotations = metadata.get("annotations") or {}
    statuses = status.get("containerStatuses") or []
    running = any(s.get("name") == CONTAINER and (s.get("state") or {}).get("running") is not None for s in statuses)
    return ObservedPod(
        uid=str(metadata.get("uid") or ""),
        phase=str(status.get("phase") or "Unknown"),
        deleting=metadata.get("deletionTimestamp") is not None,
        container_running=running,
        plan_hash=annotations.get(ANNOTATION_PLAN),
        image=annotations.get(ANNOTATION_IMAGE),
        node=(pod.get("spec") or {}).get("nodeName"),
        runtime_class=(pod.get("spec") or {}).get("runtimeClassName"),
    )


def user_of(labels: Mapping[str, str] | None) -> int | None:
    """The user id a managed pod's labels name, or None when they name none."""
    raw = (labels or {}).get(LABEL_USER, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


# Waiting reasons that will not resolve by waiting (a wrong image, a bad spec).
_STUCK_WAITING = {
    "ErrImageNeverPull": "the sandbox image {image} is not on the node (imagePullPolicy Never): load it there",
    "ErrImagePull": "the node could not pull the sandbox image {image}",
    "ImagePullBackOff": "the node could not pull the sandbox image {image}",
    "InvalidImageName": "the sandbox image name {image} is not valid",
    "CreateContainerConfigError": "the pod's container could not be configured",
    "CreateContainerError": "the pod's container could not be created",
    "RunContainerError": "the pod's container could not be started",
    "CrashLoopBackOff": "the agent keeps crashing",
}


@dataclass(frozen=True)
class PodProblem:
    message: str
    waits: bool = False  # may resolve by itself (unschedulable now): reported at the deadline


def pod_problem(pod: Mapping[str, Any], image: str) -> PodProblem | None:
    """Why the pod will not become ready, in words for the model and the operator; None while
    it is still on its way (or running). From the pod's own status: the scheduler's
    condition, the container's waiting or terminated state, an eviction."""
    found = _problem_text(pod, image)
    if found is None:
        return None
    return PodProblem(found, waits=found.startswith(UNSCHEDULABLE))


UNSCHEDULABLE = "no node can run the sandbox pod now"


def _problem_text(pod: Mapping[str, Any], image: str) -> str | None:
    status = pod.get("status") or {}
    phase = status.get("phase")
    reason = status.get("reason") or ""
    message = (status.get("message") or "").strip()
    if phase == "Failed" and reason == "Evicted":
        return f"the pod was evicted from its node: {message}".rstrip(": ")
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        why = _STUCK_WAITING.get(waiting.get("reason") or "")
        if why is not None:
            detail = (waiting.get("message") or "").strip()
            return why.format(image=image) + (f" ({detail[:300]})" if detail else "")
        terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
        if terminated:
            if terminated.get("reason") == "OOMKilled":
                return "the sandbox ran out of memory (OOMKilled): its memory limit was reached"
            code = terminated.get("exitCode")
            return f"the agent exited ({terminated.get('reason') or 'Error'}, exit code {code})"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            if condition.get("reason") == "Unschedulable":
                detail = (condition.get("message") or "no node can run it").strip()
                return f"{UNSCHEDULABLE}: {detail[:300]}"
    if phase in ("Failed", "Succeeded"):
        return f"the pod ended ({phase}{': ' + message if message else ''})"
    return None
