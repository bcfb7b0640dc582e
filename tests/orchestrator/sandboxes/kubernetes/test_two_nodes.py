"""Two nodes: a second kubelet `vm` with its own Docker engine (deploy/kubernetes/local/
k8s-add-node.sh), the sandbox image loaded into it. Pods of different users spread over both
nodes; draining `vm` (cordon, then evict its pods through the eviction API, as `kubectl drain`
does) moves its users' sandboxes, and a drained user's next call succeeds on `localhost` with
its files intact: the data volume (a hostPath of one machine's data dir here, a ReadWriteMany
PVC on a real cluster) is the same on every node.

`vm` is registered with a taint that only this test's pods tolerate: the cluster is shared, and
other pods must neither land on a node that is about to go nor be evicted by this drain. Only
`vm` is ever cordoned or drained. It is removed again at the end, whatever happened."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.settings import K8sToleration
from tests.api_calls import start_run, tool
from tests.conftest import API_TOKEN
from tests.kube_cluster import CLUSTER_ROOT, LOCAL_SCRIPTS
from tests.live_server import free_port
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_settings

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NODE = "vm"  # resolves to 127.0.0.1 (/etc/hosts): the API server reaches its kubelet by name
FIRST_NODE = "localhost"  # others' pods run there: never cordoned, never drained
TAINT = K8sToleration(key="sandbox-orchestrator/test-node", value=NODE, effect="NoSchedule")
LABEL_USER = "sandbox-orchestrator/user"
USERS = (41, 42, 43, 44)


def kubelet_port() -> int:
    """A free port whose +8 (the script's healthz port) is free too."""
    while True:
        port = free_port()
        if port + 8 < 65536 and not _listening(port + 8):
            return port


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def local_script(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> None:
    environment = {**os.environ, "ROOT": str(CLUSTER_ROOT), **(env or {})}
    result = subprocess.run(
        ["bash", *args], env=environment, capture_output=True, text=True, timeout=timeout, cwd=LOCAL_SCRIPTS
    )
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def second_node(kube: client.CoreV1Api, k8s_image: str) -> Iterator[str]:
    try:
        kube.read_node(NODE)
        pytest.fail(f"a node {NODE} exists already: not this test's to add, drain or remove")
    except ApiException as exc:
        if exc.status != 404:
            raise
    taint = f"{TAINT.key}={TAINT.value}:{TAINT.effect}"
    try:
        # The sandbox image is copied from the first node's engine (k8s_image loaded it there).
        local_script("k8s-add-node.sh", NODE, str(kubelet_port()), k8s_image, env={"TAINTS": taint})
        yield NODE
    finally:
        local_script("k8s-local.sh", "remove-node", NODE, timeout=120)


@pytest.fixture
def two_node_client(
    second_node: str, k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> Iterator[TestClient]:
    # Small sandboxes: four pods (a quarter of a core each, k8s_settings) fit beside everyone
    # else's on two cores.
    settings = k8s_settings(k8s_data_dir, k8s_namespace, k8s_image, k8s_tolerations=(TAINT,), sandbox_memory_mb=128)
    service = OrchestratorService(settings)
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as test_client:
            yield test_client
    finally:
        service.close()
        kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)


def personal_run(test_client: TestClient, user: int) -> str:
    response = test_client.post("/v1/sessions", json={"owner_user_id": user, "channel": "web"})
    assert response.status_code == 201, response.text
    return start_run(test_client, response.json()["session_id"], trigger="web")["run_id"]


def pods_by_user(kube: client.CoreV1Api, namespace: str) -> dict[int, client.V1Pod]:
    pods = kube.list_namespaced_pod(namespace).items
    return {int(p.metadata.labels[LABEL_USER]): p for p in pods if p.metadata.deletion_timestamp is None}


def drain(kube: client.CoreV1Api, node: str, namespace: str) -> list[str]:
    """`kubectl drain` of `node`, by the API: cordon it, then evict its pods (policy/v1beta1
    on Kubernetes 1.20: the eviction API honours disruption budgets, unlike a delete). Only
    this test's namespace: nothing else tolerates the node's taint."""
    assert node != FIRST_NODE
    kube.patch_node(node, {"spec": {"unschedulable": True}})
    pods = kube.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    for pod in pods:
        eviction = {
            "apiVersion": "policy/v1beta1",
            "kind": "Eviction",
            "metadata": {"name": pod.metadata.name, "namespace": namespace},
        }
        kube.create_namespaced_pod_eviction(pod.metadata.name, namespace, eviction)
    deadline = time.monotonic() + 60
    while kube.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items:
        assert time.monotonic() < deadline, "the evicted pods did not go"
        time.sleep(0.5)
    return [p.metadata.name for p in pods]


def test_users_spread_over_two_nodes_and_a_drained_users_next_call_moves_with_its_files(
    two_node_client: TestClient, second_node: str, kube: client.CoreV1Api, k8s_namespace: str
) -> None:
    runs = {user: personal_run(two_node_client, user) for user in USERS}

    def first_call(user: int) -> dict:
        return tool(two_node_client, runs[user], "write_file", path="notes/mine.txt", content=f"user {user}\n")

    with concurrent.futures.ThreadPoolExecutor(len(USERS)) as pool:  # the pods start in parallel
        for written in pool.map(first_call, USERS):
            assert written["ok"], written
    pods = pods_by_user(kube, k8s_namespace)
    nodes = {user: pod.spec.node_name for user, pod in pods.items()}
    assert sorted(nodes) == sorted(USERS), nodes
    # Spread: both nodes hold users' pods, evenly (maxSkew 1 of the pods' spread constraint).
    on_node = {n: sorted(u for u, at in nodes.items() if at == n) for n in (FIRST_NODE, second_node)}
    print(f"pods per node: {on_node}")  # shown with -s
    assert set(nodes.values()) == {FIRST_NODE, second_node}, on_node
    assert abs(len(on_node[FIRST_NODE]) - len(on_node[second_node])) <= 1, on_node

    evicted = drain(kube, second_node, k8s_namespace)
    assert len(evicted) == len(on_node[second_node])
    assert kube.read_node(FIRST_NODE).spec.unschedulable is not True  # never touched
    for user in on_node[second_node]:
        answer = tool(two_node_client, runs[user], "read_file", path="notes/mine.txt")
        assert answer["ok"], answer
        assert answer["result"]["content"] == f"user {user}\n"
        moved = pods_by_user(kube, k8s_namespace)[user]
        assert moved.spec.node_name == FIRST_NODE
        assert moved.metadata.uid != pods[user].metadata.uid  # a new pod, on the other node
    # The users of the node that stayed kept their pods.
    for user in on_node[FIRST_NODE]:
        assert tool(two_node_client, runs[user], "read_file", path="notes/mine.txt")["result"]["content"] == f"user {user}\n"
        assert pods_by_user(kube, k8s_namespace)[user].metadata.uid == pods[user].metadata.uid
