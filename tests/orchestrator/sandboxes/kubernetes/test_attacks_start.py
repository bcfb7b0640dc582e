"""Attacks on a pod's next start, as a hostile sandbox prepares them with its own shell
between two starts (the data volume outlives the pod):

- nothing it leaves in its own directories may keep its next agent from answering, which
  would hold one of the backend's few start slots (and a start thread) for the whole ready
  timeout, again at every call;
- it cannot swap a planned directory for a symlink: the kubelet (root) resolves a subPath
  following symlinks that stay inside the volume, and the volume is the whole data dir, so
  only the root-owned parents of every planned path keep another user's directory out;
- it cannot take the agent's port on another address of the pod's loopback.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from orchestrator.service import OrchestratorService
from orchestrator.sandboxes.kubernetes_spec import pod_name
from tests.api_calls import OWNER, group_session, start_run, tool
from tests.orchestrator.sandboxes.kubernetes.conftest import served

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

READY_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def api(kube: client.CoreV1Api, k8s_namespace: str, k8s_image: str) -> Iterator[tuple[TestClient, OrchestratorService, str]]:
    with served(kube, k8s_namespace, k8s_image, sandbox_ready_timeout_s=READY_TIMEOUT_S) as (test_client, service):
        run = start_run(test_client, group_session(test_client), trigger="web")["run_id"]
        yield test_client, service, run


def shell(test_client: TestClient, run: str, command: str) -> str:
    answer = tool(test_client, run, "shell", command=command)
    assert answer["ok"], answer
    return answer["result"]["stdout"] + answer["result"]["stderr"]


def test_planned_directories_cannot_be_swapped_for_links(
    api: tuple[TestClient, OrchestratorService, str], kube: client.CoreV1Api, k8s_namespace: str
) -> None:
    test_client, service, run = api
    shell(test_client, run, "true")  # the pod runs
    backend = service.sandboxes.backends["kubernetes"]
    pod = kube.read_namespaced_pod(pod_name(backend.instance, OWNER), k8s_namespace)
    paths = [m.mount_path for m in pod.spec.containers[0].volume_mounts if m.sub_path and m.mount_path != "/tmp"]
    assert len(paths) >= 10, paths
    other = service.layout.home_dir(OWNER + 1)
    tries = "; ".join(
        f'mv {p} {p}.x 2>/dev/null && echo MOVED {p}; ln -s {other} {p}.x 2>/dev/null && echo LINKED {p}' for p in paths
    )
    assert "MOVED" not in (out := shell(test_client, run, tries)) and "LINKED" not in out, out


def test_the_agents_port_cannot_be_taken_on_another_address(api: tuple[TestClient, OrchestratorService, str]) -> None:
    test_client, service, run = api
    port = service.settings.k8s_agent_port
    binds = "; ".join(
        f"python3 -c \"import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('{address}', {port}))\" 2>&1 | tail -1"
        for address in ("127.0.0.1", "0.0.0.0")
    )
    out = shell(test_client, run, binds).splitlines()
    assert len(out) == 2 and all("Address already in use" in line for line in out), out


def test_fifos_at_the_agents_config_files_do_not_hang_its_next_start(api: tuple[TestClient, OrchestratorService, str]) -> None:
    test_client, service, run = api
    # The agent writes pip's and npm's proxy settings into HOME at every start (egress on).
    planted = shell(
        test_client, run,
        "cd ~ && rm -f .config/pip/pip.conf .npmrc .config/pip/.pip.conf.agent-tmp "
        "&& mkfifo .config/pip/pip.conf .npmrc .config/pip/.pip.conf.agent-tmp && ls -l .npmrc",
    )  # fmt: skip
    assert planted.startswith("p"), planted
    service.sandboxes.backends["kubernetes"].stop(OWNER)  # idle, say: its pod is deleted
    answer = tool(test_client, run, "shell", command="echo up; ls -l ~/.npmrc")  # a new pod, a new agent
    assert answer["ok"], answer  # before: "its agent did not answer /health within 20 s"
    up, npmrc = answer["result"]["stdout"].splitlines()
    assert up == "up" and npmrc.startswith("p")  # the user's FIFO is left alone, unopened
