"""The kubernetes backend's deciders: the pod manifest from the mount plan, the sandboxes'
NetworkPolicy, the lifecycle decision table, a pod as the API reports it, and the words of
a pod that will not become ready. No cluster needed (the counterpart of test_docker_spec.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mounts.layout import DataLayout, GroupRef
from mounts.plan import Access, plan_mounts
from orchestrator.sandboxes.docker_spec import Limits
from orchestrator.sandboxes.kubernetes_spec import (
    ANNOTATION_BUILD,
    ANNOTATION_IMAGE,
    ANNOTATION_PLAN,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_USER,
    DataVolume,
    DesiredPod,
    ObservedPod,
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
from orchestrator.sandboxes.lifecycle_decision import LifecycleAction as PodAction
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState
from orchestrator.sandboxes.lifecycle_decision import decide as decide_action
from orchestrator.sandboxes.lifecycle_decision import fit_of

ROOT = Path("/srv/orch/data")
LAYOUT = DataLayout(ROOT)
IMAGE = "sandbox-orchestrator/sandbox:r1"
GROUP = GroupRef("feishu_group", "chat-1")
UID = 310000007
SHARED_GID = 310000000
GROUP_GID = 320000001


def manifest_for(user_id: int = 7, groups=(), claim: str | None = None, **overrides: Any):  # type: ignore[no-untyped-def]
    plan = plan_mounts(LAYOUT, user_id, groups, {g: GROUP_GID for g in groups})
    values: dict[str, Any] = {
        "instance": "abc123",
        "plan": plan,
        "image": IMAGE,
        "pull_policy": "IfNotPresent",
        "agent_build": "build-1",
        "data": DataVolume(ROOT, claim),
        "sandbox_uid": UID,
        "sandbox_gid": UID,
        "extra_gids": (SHARED_GID, *plan.group_gids),
        "limits": Limits(cpus=0.5, memory_mb=512, pids=256),
        "requests": Requests(cpus=0.25, memory_mb=256),
        "agent_dir": LAYOUT.agent_dir,
        "home_dir": LAYOUT.home_dir(user_id),
        "config_path": LAYOUT.socket_dir(user_id) / "agent.json",
    }
    values.update(overrides)
    return plan, pod_manifest(**values)


def the_container(manifest: dict[str, Any]) -> dict[str, Any]:
    (container,) = manifest["spec"]["containers"]
    return container


def test_the_pod_runs_as_the_users_uid_and_groups_with_nothing_to_escalate_with() -> None:
    _, manifest = manifest_for(groups=[GROUP])
    spec, container = manifest["spec"], the_container(manifest)
    pod_security = spec["securityContext"]
    assert pod_security["runAsUser"] == UID and pod_security["runAsGroup"] == UID
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["supplementalGroups"] == [SHARED_GID, GROUP_GID]  # share/ and the group workspace
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["runAsUser"] == UID and security["runAsGroup"] == UID and security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]} and "add" not in security["capabilities"]
    assert security["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert "hostNetwork" not in spec and "hostPID" not in spec and "hostIPC" not in spec
    assert spec["restartPolicy"] == "Never"


def test_limits_come_from_the_docker_settings_and_requests_never_exceed_them() -> None:
    _, manifest = manifest_for()
    assert the_container(manifest)["resources"] == {
        "limits": {"cpu": "500m", "memory": "512Mi"},
        "requests": {"cpu": "250m", "memory": "256Mi"},
    }
    _, greedy = manifest_for(requests=Requests(cpus=4.0, memory_mb=4096))
    assert the_container(greedy)["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
    _, tiny = manifest_for(limits=Limits(cpus=0.0001, memory_mb=64, pids=64), requests=Requests(0.0001, 64))
    assert the_container(tiny)["resources"]["limits"]["cpu"] == "1m"  # never "0m": that means no limit


def test_each_plan_entry_is_a_sub_path_of_the_data_volume_at_the_same_path() -> None:
    plan, manifest = manifest_for(groups=[GROUP])
    container = the_container(manifest)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"] if m["name"] == "data"}
    assert len(mounts) == len(plan.mounts)
    for entry in plan.mounts:
        mount = mounts[str(entry.sandbox_path)]
        assert Path(ROOT, mount["subPath"]) == entry.host_path
        assert mount["readOnly"] is (entry.access is Access.READ_ONLY), entry
    assert mounts["/tmp"]["subPath"] == "tmp/7" and mounts["/tmp"]["readOnly"] is False
    for read_only in ("/srv/orch/data/skill-views/7", "/srv/orch/data/userskills/7", "/srv/orch/data/agent"):
        assert mounts[read_only]["readOnly"] is True, read_only
    assert mounts["/srv/orch/data/groups/feishu_group/chat-1"]["readOnly"] is False
    for forbidden in ("state", "sessions", "skills", "skill-views/.content", "runtime/8", "uploads/8", "home/8"):
        assert all(not m["subPath"].startswith(forbidden) for m in mounts.values()), forbidden
    # Besides the plan: only the pod's own scratch /run (memory, small).
    others = [m for m in container["volumeMounts"] if m["name"] != "data"]
    assert others == [{"name": "run", "mountPath": "/run"}]
    run = next(v for v in manifest["spec"]["volumes"] if v["name"] == "run")
    assert run["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}


def test_the_data_volume_is_a_host_path_by_default_and_the_claim_when_one_is_named() -> None:
    _, host = manifest_for()
    assert host["spec"]["volumes"][0] == {"name": "data", "hostPath": {"path": str(ROOT), "type": "Directory"}}
    _, shared = manifest_for(claim="orch-data")
    assert shared["spec"]["volumes"][0] == {"name": "data", "persistentVolumeClaim": {"claimName": "orch-data"}}
    assert [m["subPath"] for m in the_container(host)["volumeMounts"][:-1]] == [
        m["subPath"] for m in the_container(shared)["volumeMounts"][:-1]
    ]
    assert DataVolume(ROOT).describe() == f"hostPath {ROOT}"
    assert DataVolume(ROOT, "orch-data").describe() == "persistentVolumeClaim orch-data"


@pytest.mark.parametrize("outside", [Path("/etc"), Path("/srv/orch"), ROOT, Path("/srv/orch/data-other/x")])
def test_a_path_outside_the_data_directory_cannot_be_mounted_from_it(outside: Path) -> None:
    with pytest.raises(ValueError):
        DataVolume(ROOT).sub_path(outside)


def test_the_ca_bundle_is_the_only_other_host_path_and_read_only() -> None:
    _, manifest = manifest_for(ca_bundle=Path("/etc/ssl/certs/ca-certificates.crt"))
    volume = next(v for v in manifest["spec"]["volumes"] if v["name"] == "ca-bundle")
    assert volume["hostPath"] == {"path": "/etc/ssl/certs/ca-certificates.crt", "type": "File"}
    mount = next(m for m in the_container(manifest)["volumeMounts"] if m["name"] == "ca-bundle")
    assert mount == {"name": "ca-bundle", "mountPath": "/etc/ssl/certs/ca-certificates.crt", "readOnly": True}


def test_names_labels_annotations_and_no_token_anywhere_in_the_spec() -> None:
    plan, manifest = manifest_for()
    metadata = manifest["metadata"]
    assert metadata["name"] == pod_name("abc123", 7) == "orch-abc123-user-7"
    assert metadata["labels"] == {LABEL_MANAGED: "sandbox", LABEL_INSTANCE: "abc123", LABEL_USER: "7"}
    assert metadata["annotations"] == {ANNOTATION_PLAN: plan.plan_hash, ANNOTATION_IMAGE: IMAGE, ANNOTATION_BUILD: "build-1"}
    assert selector("abc123") == f"{LABEL_MANAGED}=sandbox,{LABEL_INSTANCE}=abc123"
    container = the_container(manifest)
    assert container["image"] == IMAGE and container["imagePullPolicy"] == "IfNotPresent"
    assert container["args"] == ["--config", "/srv/orch/data/sockets/7/agent.json"]
    assert {e["name"] for e in container["env"]} == {"HOME", "TMPDIR", "SANDBOX_AGENT_DIR"}
    assert all("valueFrom" not in e for e in container["env"])  # nothing from a Secret
    assert all("secret" not in v and "projected" not in v for v in manifest["spec"]["volumes"])
    # No word of a token anywhere but the one key that switches the service account's off.
    text = json.dumps(manifest).lower().replace('"automountserviceaccounttoken": false', "")
    assert "token" not in text and "secret" not in text.replace("agent-secrets", "")
    # The probes are exec probes (a pod may have no IP to dial), asking the agent's /health.
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == [
            "/usr/local/bin/sandbox-entrypoint", "--probe", "--config", "/srv/orch/data/sockets/7/agent.json"
        ]  # fmt: skip
        assert "httpGet" not in container[probe] and "tcpSocket" not in container[probe]


def test_the_network_policy_denies_all_ingress_and_egress_of_this_instances_sandboxes() -> None:
    policy = network_policy("abc123")
    assert policy["kind"] == "NetworkPolicy" and policy["apiVersion"] == "networking.k8s.io/v1"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_MANAGED: "sandbox", LABEL_INSTANCE: "abc123"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [] and spec["egress"] == []  # no rule: nothing allowed
    assert network_policy("abc123")["metadata"]["name"] != network_policy("def456")["metadata"]["name"]


# --- the decision table -------------------------------------------------------------------

DESIRED = DesiredPod(plan_hash="p1", image="i1", agent_build="b1")


def decide_pod(observed: ObservedPod | None, desired: DesiredPod, *, running_build: str | None, busy: bool) -> PodAction:
    """What the lifecycle engine decides for the pod the API reports (its state and whether it is
    outdated, then the one table; a pod is never restarted in place)."""
    state = SandboxState.ABSENT if observed is None else pod_state(observed)
    outdated = observed is not None and pod_outdated(observed, desired)
    fit = fit_of(outdated=outdated, running_build=running_build, wanted_build=desired.agent_build)
    return decide_action(state, fit, busy=busy, restarts_in_place=False)


def pod(
    *, phase: str = "Running", running: bool = True, deleting: bool = False, plan: str = "p1", image: str = "i1",
    runtime_class: str | None = None,
) -> ObservedPod:
    return ObservedPod("uid-1", phase, deleting, running, plan, image, runtime_class=runtime_class)


@pytest.mark.parametrize(
    ("observed", "running_build", "busy", "action"),
    [
        (None, None, False, PodAction.CREATE),
        (pod(), "b1", False, PodAction.USE),
        (pod(), None, False, PodAction.USE),
        (pod(), "b1", True, PodAction.USE),
        (pod(phase="Pending", running=False), None, False, PodAction.WAIT),
        (pod(running=False), None, False, PodAction.WAIT),  # running, its container not yet
        (pod(plan="p0"), "b1", False, PodAction.RECREATE),  # the plan changed: idle, so now
        (pod(image="i0"), "b1", False, PodAction.RECREATE),
        (pod(runtime_class="gvisor"), "b1", False, PodAction.RECREATE),  # ORCH_K8S_RUNTIME_CLASS changed
        (pod(runtime_class="gvisor"), "b1", True, PodAction.USE),
        (pod(), "b0", False, PodAction.RECREATE),  # the agent's BUILD drifted: no restart in place
        (pod(plan="p0"), "b1", True, PodAction.USE),  # busy: its calls finish first
        (pod(), "b0", True, PodAction.USE),
        (pod(plan="p0", phase="Pending", running=False), None, True, PodAction.RECREATE),  # nothing to finish
        (pod(phase="Failed", running=False), None, False, PodAction.RECREATE),  # crashed, OOMKilled, evicted
        (pod(phase="Succeeded", running=False), None, True, PodAction.RECREATE),
        (pod(phase="Unknown", running=False), None, False, PodAction.RECREATE),  # its node is lost
        (pod(deleting=True), "b1", True, PodAction.RECREATE),  # being deleted (kubectl delete, a drain)
    ],
)
def test_decision_table(observed, running_build, busy, action) -> None:  # type: ignore[no-untyped-def]
    assert decide_pod(observed, DESIRED, running_build=running_build, busy=busy) is action


def api_pod(
    *, phase: str = "Running", state: dict | None = None, last_state: dict | None = None,
    conditions: list | None = None, reason: str | None = None, message: str | None = None,
    deleting: bool = False, name: str = "sandbox",
) -> dict[str, Any]:  # fmt: skip
    """A pod as the API serializes it (the camelCase JSON of `read_namespaced_pod`)."""
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if reason is not None:
        status["reason"] = reason
    if message is not None:
        status["message"] = message
    if state is not None:
        status["containerStatuses"] = [{"name": name, "state": state, "lastState": last_state or {}}]
    metadata: dict[str, Any] = {
        "name": "orch-abc123-user-7",
        "uid": "5f0c",
        "labels": {LABEL_USER: "7"},
        "annotations": {ANNOTATION_PLAN: "p1", ANNOTATION_IMAGE: "i1"},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-01T20:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": "localhost"}, "status": status}


def test_observed_pod_from_the_api_json() -> None:
    running = api_pod(state={"running": {"startedAt": "2026-12-01T20:00:00Z"}})
    assert observed_pod(running) == ObservedPod("5f0c", "Running", False, True, "p1", "i1", "localhost")
    waiting = api_pod(phase="Pending", state={"waiting": {"reason": "ContainerCreating"}}, deleting=True)
    assert observed_pod(waiting) == ObservedPod("5f0c", "Pending", True, False, "p1", "i1", "localhost")
    # Another container's state says nothing of the sandbox's; no status at all is Unknown.
    assert observed_pod(api_pod(state={"running": {}}, name="sidecar")).container_running is False
    assert observed_pod({"metadata": {}}) == ObservedPod("", "Unknown", False, False, None, None, None)
    assert observed_pod({**running, "spec": {"runtimeClassName": "gvisor"}}).runtime_class == "gvisor"
    assert user_of({LABEL_USER: "7"}) == 7
    assert user_of({LABEL_USER: "../1"}) is None and user_of({LABEL_USER: "0"}) is None and user_of(None) is None


# --- what a pod that will not start says ----------------------------------------------------


def test_a_pod_on_its_way_or_running_has_no_problem() -> None:
    assert pod_problem(api_pod(phase="Pending"), IMAGE) is None
    assert pod_problem(api_pod(phase="Pending", state={"waiting": {"reason": "ContainerCreating"}}), IMAGE) is None
    assert pod_problem(api_pod(state={"running": {}}), IMAGE) is None
    scheduled = [{"type": "PodScheduled", "status": "True"}]
    assert pod_problem(api_pod(phase="Pending", conditions=scheduled), IMAGE) is None


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("ErrImageNeverPull", f"the sandbox image {IMAGE} is not on the node (imagePullPolicy Never): load it there"),
        ("ErrImagePull", f"the node could not pull the sandbox image {IMAGE}"),
        ("ImagePullBackOff", f"the node could not pull the sandbox image {IMAGE}"),
        ("InvalidImageName", f"the sandbox image name {IMAGE} is not valid"),
        ("CreateContainerConfigError", "the pod's container could not be configured"),
        ("CrashLoopBackOff", "the agent keeps crashing"),
    ],
)
def test_a_missing_or_broken_image_is_said_at_once_with_the_kubelets_detail(reason: str, words: str) -> None:
    detail = 'Container image "x" is not present with pull policy of Never'
    problem = pod_problem(api_pod(phase="Pending", state={"waiting": {"reason": reason, "message": detail}}), IMAGE)
    assert problem is not None and problem.waits is False
    assert problem.message == f"{words} ({detail})"
    bare = pod_problem(api_pod(phase="Pending", state={"waiting": {"reason": reason}}), IMAGE)
    assert bare is not None and bare.message == words


def test_a_long_kubelet_message_is_cut() -> None:
    problem = pod_problem(api_pod(phase="Pending", state={"waiting": {"reason": "ErrImagePull", "message": "x" * 5000}}), IMAGE)
    assert problem is not None and len(problem.message) < 400


def test_unschedulable_says_why_and_may_resolve_by_waiting() -> None:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/1 nodes are available: 1 Insufficient cpu."}  # fmt: skip
    problem = pod_problem(api_pod(phase="Pending", conditions=[condition]), IMAGE)
    assert problem is not None and problem.waits is True
    assert problem.message == "no node can run the sandbox pod now: 0/1 nodes are available: 1 Insufficient cpu."


def test_out_of_memory_is_named_as_such() -> None:
    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    for status in (api_pod(phase="Failed", state=oom), api_pod(phase="Running", state={"waiting": {}}, last_state=oom)):
        problem = pod_problem(status, IMAGE)
        assert problem is not None and problem.waits is False
        assert problem.message == "the sandbox ran out of memory (OOMKilled): its memory limit was reached"


def test_an_eviction_says_the_nodes_reason() -> None:
    evicted = api_pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory. ")
    problem = pod_problem(evicted, IMAGE)
    assert problem is not None and problem.message == "the pod was evicted from its node: The node was low on resource: memory."
    bare = pod_problem(api_pod(phase="Failed", reason="Evicted"), IMAGE)
    assert bare is not None and bare.message == "the pod was evicted from its node"


def test_a_crashed_or_ended_agent_says_how_it_ended() -> None:
    crashed = pod_problem(api_pod(phase="Failed", state={"terminated": {"reason": "Error", "exitCode": 1}}), IMAGE)
    assert crashed is not None and crashed.message == "the agent exited (Error, exit code 1)"
    killed = pod_problem(api_pod(phase="Failed", state={"terminated": {"exitCode": 137}}), IMAGE)
    assert killed is not None and killed.message == "the agent exited (Error, exit code 137)"
    ended = pod_problem(api_pod(phase="Failed", message="the node shut down"), IMAGE)
    assert ended is not None and ended.message == "the pod ended (Failed: the node shut down)"
    assert pod_problem(api_pod(phase="Succeeded"), IMAGE).message == "the pod ended (Succeeded)"  # type: ignore[union-attr]
