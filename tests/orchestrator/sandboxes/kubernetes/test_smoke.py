"""The group scenario end to end on the kubernetes backend: a real `orchestrator serve`
subprocess with ORCH_BACKEND=kubernetes in the module's own namespace, and
`orchestrator smoke --backend kubernetes` against it (as tests/orchestrator/test_smoke.py does
for the process and docker backends): every check passes, in pods."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from tests.kube_cluster import KUBECONFIG
from tests.live_server import free_port, serve_process
from tests.orchestrator.test_smoke import assert_all_passed, run_smoke_command

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_the_smoke_passes_on_the_kubernetes_backend(
    k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> None:
    env = {
        "ORCH_BACKEND": "kubernetes",
        "ORCH_K8S_KUBECONFIG": str(KUBECONFIG),
        "ORCH_K8S_NAMESPACE": k8s_namespace,
        "ORCH_K8S_IMAGE_PULL_POLICY": "Never",
        "ORCH_SANDBOX_IMAGE": k8s_image,
        # The node has two cores shared by every test; pods request what they limit.
        "ORCH_SANDBOX_CPUS": "0.1",
        "ORCH_SANDBOX_MEMORY_MB": "256",
    }
    try:
        with serve_process(str(k8s_data_dir), free_port(), env) as url:
            result = run_smoke_command(url, None, "--backend", "kubernetes", cwd=k8s_data_dir.parent)
            pods = kube.list_namespaced_pod(k8s_namespace).items
    finally:
        kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)
    assert_all_passed(result)
    assert "backend kubernetes" in result.stdout
    # The scenario's users ran in pods of this namespace (A's and B's), not on another backend.
    users = {p.metadata.labels["sandbox-orchestrator/user"] for p in pods}
    assert len(users) >= 2, [p.metadata.name for p in pods]
