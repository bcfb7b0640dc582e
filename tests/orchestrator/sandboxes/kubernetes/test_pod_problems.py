"""A pod that cannot become ready says why at once, in pod_problem's words, as
`sandbox_unavailable` (not after the ready timeout): an image the node does not have
(imagePullPolicy Never), and an agent killed for exceeding its memory limit (OOMKilled)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from kubernetes import client

from orchestrator.errors import ToolError
from orchestrator.service import OrchestratorService
from tests.agent_env import blocking_call
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_settings
from tests.orchestrator.sandboxes.kubernetes.life_env import backend_of, pods_of, sandbox_user, wait_for, workdir

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

USER = 17
READY_TIMEOUT_S = 60.0  # what a timeout would have cost


def failed_start(service: OrchestratorService) -> tuple[ToolError, float]:
    started = time.monotonic()
    with pytest.raises(ToolError) as failed:
        blocking_call(backend_of(service), sandbox_user(service, USER), "list_dir", {"path": "."}, cwd=workdir(service, USER))
    return failed.value, time.monotonic() - started


def test_an_image_missing_on_the_node_is_said_within_seconds(
    k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> None:
    missing = f"sandbox-orchestrator/sandbox:not-loaded-{secrets.token_hex(4)}"
    service = OrchestratorService(k8s_settings(k8s_data_dir, k8s_namespace, missing, sandbox_ready_timeout_s=READY_TIMEOUT_S))
    try:
        error, seconds = failed_start(service)
        assert error.code == "sandbox_unavailable"
        assert f"The sandbox of user {USER} is not available" in error.message
        assert f"the sandbox image {missing} is not on the node (imagePullPolicy Never): load it there" in error.message
        assert seconds < 15, seconds
        # Nothing of it is kept: the next call starts afresh.
        wait_for(lambda: pods_of(kube, k8s_namespace, service, USER) == [], "the failed pod was not deleted")
    finally:
        service.close()


def test_an_agent_over_its_memory_limit_is_reported_as_out_of_memory(
    k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> None:
    # 24 MiB: the container starts, the agent's Python outgrows it while importing.
    settings = k8s_settings(k8s_data_dir, k8s_namespace, k8s_image, sandbox_memory_mb=24, sandbox_ready_timeout_s=READY_TIMEOUT_S)
    service = OrchestratorService(settings)
    try:
        error, seconds = failed_start(service)
        assert error.code == "sandbox_unavailable"
        assert "the sandbox ran out of memory (OOMKilled): its memory limit was reached" in error.message, error.message
        assert seconds < 20, seconds
    finally:
        service.close()


def test_an_unschedulable_pod_says_why_when_its_ready_time_is_up(
    k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> None:
    # More CPU than the node has: it may fit later (a node added), so it waits its ready
    # time, then says the scheduler's reason instead of "did not answer /health".
    settings = k8s_settings(k8s_data_dir, k8s_namespace, k8s_image, sandbox_cpus=64, sandbox_ready_timeout_s=4)
    service = OrchestratorService(settings)
    try:
        error, seconds = failed_start(service)
        assert error.code == "sandbox_unavailable"
        assert "no node can run the sandbox pod now: 0/" in error.message and "Insufficient cpu" in error.message, error.message
        assert 4 <= seconds < 15, seconds
        wait_for(lambda: pods_of(kube, k8s_namespace, service, USER) == [], "the unschedulable pod was not deleted")
    finally:
        service.close()
