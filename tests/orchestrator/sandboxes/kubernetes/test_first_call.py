"""The kubernetes backend end to end on the real cluster: a model's first tool call creates
the user's pod and runs in it, through the API's port-forward."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from orchestrator.service import OrchestratorService
from tests.api_calls import group_session, start_run, tool

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

A = 17


def test_a_first_call_runs_in_the_users_own_pod(
    k8s_client: TestClient, k8s_service: OrchestratorService, kube: client.CoreV1Api, k8s_namespace: str
) -> None:
    run = start_run(k8s_client, group_session(k8s_client), trigger="web")
    answer = tool(k8s_client, run["run_id"], "shell", command="id -u; ls /sys/class/net")
    assert answer["ok"] is True, answer
    uid, *interfaces = answer["result"]["stdout"].split()
    assert uid == str(k8s_service.directories.sandbox_uid(A))
    assert interfaces == ["lo"]
    pods = kube.list_namespaced_pod(k8s_namespace).items
    assert [p.metadata.labels["sandbox-orchestrator/user"] for p in pods] == [str(A)]
    assert tool(k8s_client, run["run_id"], "write_file", path="note.txt", content="hello")["ok"]
    assert tool(k8s_client, run["run_id"], "read_file", path="note.txt")["result"]["content"] == "hello"
