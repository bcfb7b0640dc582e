"""run_code on the kubernetes backend (docs/interpreter.md): the workbench image's python runs
the kernel in the user's pod; state survives between calls and a chart comes back as a file."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from kubernetes import client

from tests.api_calls import OWNER
from tests.conftest import API_TOKEN
from tests.kube_cluster import KUBECONFIG
from tests.live_server import free_port, serve_process

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_a_kernel_in_a_pod_keeps_its_state_and_returns_a_chart(
    k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> None:
    env = {
        "ORCH_BACKEND": "kubernetes",
        "ORCH_K8S_KUBECONFIG": str(KUBECONFIG),
        "ORCH_K8S_NAMESPACE": k8s_namespace,
        "ORCH_K8S_IMAGE_PULL_POLICY": "Never",
        "ORCH_SANDBOX_IMAGE": k8s_image,
        "ORCH_SANDBOX_CPUS": "0.5",
        "ORCH_SANDBOX_MEMORY_MB": "512",  # the agent, a driver and an ipykernel with matplotlib
    }
    try:
        with serve_process(str(k8s_data_dir), free_port(), env) as url:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=300) as http:
                session = http.post("/v1/sessions", json={"owner_user_id": OWNER, "channel": "web"}).json()["session_id"]
                run_id = http.post(f"/v1/sessions/{session}/runs", json={"trigger": "web"}).json()["run_id"]

                def run_code(code: str) -> dict:
                    body = http.post(f"/v1/runs/{run_id}/tools/run_code", json={"arguments": {"code": code}}).json()
                    assert body["ok"], body
                    return body["result"]

                run_code("x = 41")
                assert run_code("x + 1")["text"] == "42"
                chart = run_code("import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2), dpi=50)\nplt.plot([1, 2])\nplt.show()")
                [image] = chart["images"]
                assert image["mime"] == "image/png" and image["size"] > 100 and "/outputs/" in image["path"]
    finally:
        kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)
