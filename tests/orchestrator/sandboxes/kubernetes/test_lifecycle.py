"""The kubernetes backend's lifecycle on the real cluster: one pod per user under concurrent
first calls, a deleted pod recreated by the next call, adoption across an orchestrator
restart (the same pod) with the pods of unknown users deleted, recreation on a changed plan
once idle, idle stop (the pod goes, the files stay), and the sandboxes' NetworkPolicy."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from mounts.layout import GroupRef
from mounts.plan import plan_mounts
from orchestrator.errors import ToolError
from orchestrator.sandboxes.base import SandboxUser
from orchestrator.sandboxes.kubernetes_spec import network_policy
from orchestrator.service import OrchestratorService
from tests.agent_env import blocking_call
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_settings, kube_configuration, separate_uid_block
from tests.orchestrator.sandboxes.kubernetes.life_env import (
    backend_of,
    data_dir,
    ended,
    gone,
    pods_of,
    sandbox_user,
    the_pod,
    wait_for,
    workdir,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

GROUP = GroupRef("feishu", "oc_team")


@pytest.fixture(scope="module")
def service(k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api) -> Iterator[OrchestratorService]:
    with data_dir() as data:
        service = OrchestratorService(k8s_settings(data, k8s_namespace, k8s_image))
        try:
            yield service
        finally:
            service.close()
            kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)


def test_concurrent_first_calls_create_exactly_one_pod_and_the_network_policy(
    service: OrchestratorService, kube: client.CoreV1Api, k8s_namespace: str
) -> None:
    backend, user, cwd = backend_of(service), sandbox_user(service, 21), workdir(service, 21)
    barrier = threading.Barrier(6)
    results: list[object] = []

    def first_call() -> None:
        barrier.wait()
        results.append(blocking_call(backend, user, "shell", {"command": "echo hi"}, cwd=cwd)["stdout"])

    threads = [threading.Thread(target=first_call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert results == ["hi\n"] * 6
    pod = the_pod(kube, k8s_namespace, service, 21)
    assert pod.status.phase == "Running"
    # Every pod ever made for the user (deleted ones included) is this one.
    everything = kube.list_namespaced_pod(k8s_namespace, label_selector="sandbox-orchestrator/user=21").items
    assert [p.metadata.uid for p in everything] == [pod.metadata.uid]
    # The adoption made the sandboxes' NetworkPolicy exist, as the pure decider writes it.
    wanted = network_policy(backend.instance)
    with client.ApiClient(kube_configuration()) as api:
        policy = client.NetworkingV1Api(api).read_namespaced_network_policy(wanted["metadata"]["name"], k8s_namespace)
    assert policy.spec.pod_selector.match_labels == wanted["spec"]["podSelector"]["matchLabels"]
    assert policy.spec.policy_types == ["Ingress", "Egress"] and not policy.spec.ingress and not policy.spec.egress


def test_a_deleted_pod_is_recreated_by_the_next_call_which_succeeds(
    service: OrchestratorService, kube: client.CoreV1Api, k8s_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend, user, cwd = backend_of(service), sandbox_user(service, 21), workdir(service, 21)
    blocking_call(backend, user, "write_file", {"path": "kept.txt", "content": "kept"}, cwd=cwd)
    first = the_pod(kube, k8s_namespace, service, 21)
    # `kubectl delete pod`, with its grace period: the agent ends. (The object stays some
    # seconds more, until the kubelet's cleanup round; `ensure` removes it at once.)
    kube.delete_namespaced_pod(first.metadata.name, k8s_namespace)
    wait_for(lambda: ended(kube, k8s_namespace, first.metadata.name), "the deleted pod's agent did not end")
    # The warm path asks no API: the call meets a pod that no longer runs (never delivered),
    # and the protocol sends it once more after `ensure` created a new pod.
    with caplog.at_level(logging.WARNING, logger="orchestrator.sandboxes.calling"):
        assert blocking_call(backend, user, "read_file", {"path": "kept.txt"}, cwd=cwd)["content"] == "kept"
    assert len([r for r in caplog.records if "was unreachable" in r.getMessage()]) == 1
    second = the_pod(kube, k8s_namespace, service, 21)
    assert second.metadata.uid != first.metadata.uid and second.status.phase == "Running"


def test_a_changed_plan_recreates_the_pod_once_it_is_idle(
    service: OrchestratorService, kube: client.CoreV1Api, k8s_namespace: str
) -> None:
    backend, cwd = backend_of(service), workdir(service, 22)
    before = sandbox_user(service, 22)
    blocking_call(backend, before, "list_dir", {"path": "."}, cwd=cwd)
    first = the_pod(kube, k8s_namespace, service, 22)
    after = sandbox_user(service, 22, groups=(GROUP,))  # the user joined a group workspace
    assert after.plan.plan_hash != before.plan.plan_hash
    group_dir = str(service.layout.group_dir(GROUP))
    slow: list[object] = []
    thread = threading.Thread(
        target=lambda: slow.append(blocking_call(backend, before, "shell", {"command": "sleep 2; echo slept"}, cwd=cwd))
    )
    thread.start()
    time.sleep(0.7)
    # Busy: the running call finishes in the old pod, and this one is served there too.
    with pytest.raises(ToolError) as missing:
        blocking_call(backend, after, "list_dir", {"path": group_dir}, cwd=cwd)
    assert missing.value.code in ("not_found", "path_escape")
    assert the_pod(kube, k8s_namespace, service, 22).metadata.uid == first.metadata.uid
    thread.join(30)
    assert slow and slow[0]["stdout"] == "slept\n"  # type: ignore[index]  # not cut off by the drift
    # Idle now: recreated with the group workspace mounted and its gid.
    assert blocking_call(backend, after, "write_file", {"path": f"{group_dir}/g.txt", "content": "g"}, cwd=cwd)
    second = the_pod(kube, k8s_namespace, service, 22)
    assert second.metadata.uid != first.metadata.uid
    assert group_dir in {m.mount_path for m in second.spec.containers[0].volume_mounts}
    assert after.plan.group_gids[0] in second.spec.security_context.supplemental_groups
    assert second.metadata.annotations["sandbox-orchestrator/plan-hash"] == after.plan.plan_hash


def test_an_idle_pod_is_deleted_and_the_users_files_stay(
    service: OrchestratorService, kube: client.CoreV1Api, k8s_namespace: str
) -> None:
    backend, user, cwd = backend_of(service), sandbox_user(service, 23), workdir(service, 23)
    blocking_call(backend, user, "write_file", {"path": "stays.txt", "content": "stays"}, cwd=cwd)
    name = the_pod(kube, k8s_namespace, service, 23).metadata.name
    assert backend.reap_idle(now=time.monotonic() + 1.0) == []  # not idle long enough
    later = time.monotonic() + service.settings.idle_timeout_s + 1.0
    assert 23 in backend.reap_idle(now=later)
    wait_for(lambda: pods_of(kube, k8s_namespace, service, 23) == [], "the idle pod was not deleted")
    assert (Path(cwd) / "stays.txt").read_text() == "stays"
    assert [s.state for s in backend.status() if s.user_id == 23] in ([], ["stopped"])  # gone, or on its way
    assert blocking_call(backend, user, "shell", {"command": "cat stays.txt"}, cwd=cwd)["stdout"] == "stays"
    the_pod(kube, k8s_namespace, service, 23)  # a new pod for the next call


def test_an_orchestrator_restart_adopts_the_same_pod_and_deletes_those_of_unknown_users(
    k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> None:
    # Its own uid block: the module's service holds the usual one meanwhile.
    block = separate_uid_block(k8s_settings(k8s_data_dir, k8s_namespace, k8s_image), 0)
    settings = k8s_settings(k8s_data_dir, k8s_namespace, k8s_image, **block)
    first = OrchestratorService(settings)
    try:
        cwd = workdir(first, 17)
        blocking_call(backend_of(first), sandbox_user(first, 17), "write_file", {"path": "a.txt", "content": "x"}, cwd=cwd)
        # A pod of a user this orchestrator's state does not know (e.g. a restored backup).
        backend_of(first).ensure(SandboxUser(55, plan_mounts(first.layout, 55)))
        before = the_pod(kube, k8s_namespace, first, 17)
        stranger = the_pod(kube, k8s_namespace, first, 55).metadata.name
    finally:
        first.close()  # the pods keep running
    assert the_pod(kube, k8s_namespace, first, 17).metadata.uid == before.metadata.uid

    second = OrchestratorService(settings)
    try:
        backend = backend_of(second)
        assert backend.adopt() == [17]
        wait_for(lambda: gone(kube, k8s_namespace, stranger), "the unknown user's pod was not deleted")
        assert blocking_call(backend, sandbox_user(second, 17), "read_file", {"path": "a.txt"}, cwd=cwd)["content"] == "x"
        after = the_pod(kube, k8s_namespace, second, 17)
        assert after.metadata.uid == before.metadata.uid  # adopted, not recreated
        assert after.status.container_statuses[0].restart_count == 0
        everything = kube.list_namespaced_pod(k8s_namespace, label_selector="sandbox-orchestrator/user=17").items
        assert [p.metadata.uid for p in everything] == [before.metadata.uid]
    finally:
        second.close()
        kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)
