"""The kubernetes backend starts a user's pod from a template image: built on this host, loaded
into the local cluster's node (ORCH_K8S_NODE_ENGINES: no registry here), the pod using the
template's content-hash tag, and the template's file there for the sandbox's shell."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.templates.recipe import recipe_of
from tests.api_calls import tool
from tests.conftest import API_TOKEN, admin_headers
from tests.kube_cluster import NODE_ENGINE
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_settings
from tests.orchestrator.sandboxes.test_process_network import web_run

pytestmark = [pytest.mark.k8s, pytest.mark.docker]

TEAM_FILE = "from a template for the cluster\n"


@pytest.fixture
def served(
    k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> Iterator[tuple[TestClient, OrchestratorService]]:
    service = OrchestratorService(k8s_settings(k8s_data_dir, k8s_namespace, k8s_image, k8s_node_engines=NODE_ENGINE))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as test_client:
            yield test_client, service
    finally:
        service.close()
        kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)


def test_a_pod_starts_from_the_users_template_image(
    served: tuple[TestClient, OrchestratorService], kube: client.CoreV1Api, k8s_namespace: str
) -> None:
    api, service = served
    service.templates.put("cluster-files", recipe_of(name="cluster-files", files={"/etc/team.txt": TEAM_FILE}))
    service.templates.wait("cluster-files", timeout=900)
    record = service.templates.get("cluster-files")
    assert record.status == "ready" and record.image is not None, record.log[-2000:]
    assert record.recipe_hash is not None and record.image.endswith(":" + record.recipe_hash[:16])

    api.put("/v1/users/67", json={})
    assigned = api.put("/v1/admin/users/67/template", json={"template": "cluster-files"}, headers=admin_headers())
    assert assigned.status_code == 200, assigned.text
    run_id = web_run(api, 67)
    answer = tool(api, run_id, "shell", command="cat /etc/team.txt; command -v git", timeout_s=60)
    assert answer["ok"], answer
    assert answer["result"]["stdout"] == TEAM_FILE + "/usr/bin/git\n", answer

    pods = kube.list_namespaced_pod(k8s_namespace).items
    images = {c.image for pod in pods for c in pod.spec.containers}
    assert record.image in images, images
