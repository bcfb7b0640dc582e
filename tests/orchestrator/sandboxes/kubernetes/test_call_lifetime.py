"""The fork-hopper findings in a pod: nothing a call started outlives it (a hopper neither, a
background process still runs), its zombies are reaped, and once the user's sandbox is
stopped (its pod deleted) nothing of the sandbox uid runs on the node. The scenarios are those
of `tests/orchestrator/sandboxes/test_call_containment.py`; the pod's processes are host
processes of the sandbox uid on this one-node cluster, so the same host-side checks apply."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER
from tests.orchestrator.sandboxes.test_call_containment import (
    HOP,
    a_hopper_dies_and_a_background_process_lives,
    a_hopper_does_not_outlive_its_call,
    kill_all_of,
    member_run,
    sandbox_uid,
    shell,
    stays_clear,
    strays,
    zombies_do_not_pile_up,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_finding1_a_fork_hopper_does_not_outlive_its_call_in_a_pod(k8s_client: TestClient, k8s_service: OrchestratorService) -> None:
    a_hopper_does_not_outlive_its_call(k8s_client, k8s_service)


def test_finding1_a_hopper_dies_and_a_background_process_lives_in_a_pod(k8s_client: TestClient, k8s_service: OrchestratorService) -> None:
    a_hopper_dies_and_a_background_process_lives(k8s_client, k8s_service)


def test_finding14_a_hoppers_zombies_are_reaped_in_a_pod(k8s_client: TestClient, k8s_service: OrchestratorService) -> None:
    zombies_do_not_pile_up(k8s_client, k8s_service)


def test_finding1_after_a_stop_nothing_of_the_sandbox_uid_runs(k8s_client: TestClient, k8s_service: OrchestratorService) -> None:
    _, run = member_run(k8s_client)
    uid = sandbox_uid(k8s_service, MEMBER)
    try:
        started = shell(k8s_client, run["run_id"], "nohup sleep 600 >/dev/null 2>&1 & echo started")
        assert started["ok"], started
        kept = shell(k8s_client, run["run_id"], "true")  # the sweep of this call takes the sleep
        assert kept["ok"], kept
        # A background process the bot asked for, and a hopper it started: both end with the pod.
        background = k8s_client.post(
            f"/v1/runs/{run['run_id']}/tools/process_start", json={"arguments": {"command": f"{HOP} exec sleep 700"}}
        ).json()
        assert background["ok"], background
        assert strays(uid), "nothing of the sandbox ran before the stop"
        k8s_service.sandboxes.backends["kubernetes"].stop(MEMBER)
        deadline = time.monotonic() + 60
        while strays(uid) and time.monotonic() < deadline:
            time.sleep(0.2)
        stays_clear(uid)
    finally:
        kill_all_of(uid)
