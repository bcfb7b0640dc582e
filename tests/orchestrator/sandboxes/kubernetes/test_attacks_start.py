"""Attacks on a pod's next start, as a hostile sandbox prepares them with its own shell
between two starts (the data volume outlives the pod): nothing it leaves in its own
directories may keep its next agent from answering, which would hold one of the backend's
few start slots (and a start thread) for the whole ready timeout, again at every call."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import OWNER, group_session, start_run, tool
from tests.conftest import API_TOKEN
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_settings

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

READY_TIMEOUT_S = 20.0


@pytest.fixture
def api(k8s_data_dir, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api) -> Iterator[tuple[TestClient, OrchestratorService]]:
    service = OrchestratorService(
        k8s_settings(k8s_data_dir, k8s_namespace, k8s_image, sandbox_ready_timeout_s=READY_TIMEOUT_S)
    )
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as test_client:
            yield test_client, service
    finally:
        service.close()
        kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)


def test_fifos_at_the_agents_config_files_do_not_hang_its_next_start(api: tuple[TestClient, OrchestratorService]) -> None:
    test_client, service = api
    run = start_run(test_client, group_session(test_client), trigger="web")["run_id"]
    # The agent writes pip's and npm's proxy settings into HOME at every start (egress on).
    planted = tool(
        test_client, run, "shell",
        command="cd ~ && rm -f .config/pip/pip.conf .npmrc .config/pip/.pip.conf.agent-tmp "
        "&& mkfifo .config/pip/pip.conf .npmrc .config/pip/.pip.conf.agent-tmp && ls -l .npmrc",
    )  # fmt: skip
    assert planted["ok"] and planted["result"]["stdout"].startswith("p"), planted
    service.sandboxes.backends["kubernetes"].stop(OWNER)  # idle, say: its pod is deleted
    answer = tool(test_client, run, "shell", command="echo up; ls -l ~/.npmrc")  # a new pod, a new agent
    assert answer["ok"], answer  # before: "its agent did not answer /health within 20 s"
    up, npmrc = answer["result"]["stdout"].splitlines()
    assert up == "up" and npmrc.startswith("p")  # the user's FIFO is left alone, unopened
