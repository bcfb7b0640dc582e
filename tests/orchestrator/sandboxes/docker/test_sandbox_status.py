"""A user's sandbox status on the docker backend (GET /v1/users/{uid}/sandbox): state and since
come from the container itself, stopped included."""

from __future__ import annotations

from datetime import datetime

import pytest
from fastapi.testclient import TestClient

from orchestrator.sandboxes.docker_spec import docker_time
from orchestrator.service import OrchestratorService
from tests.api_calls import OWNER, group_session, start_run, tool


def test_docker_time_is_stored_in_the_common_form() -> None:
    assert docker_time("2026-12-01T13:49:58.955123456Z") == "2026-12-01T13:49:58.955123+00:00"
    assert docker_time("2026-12-01T13:49:58Z") == "2026-12-01T13:49:58.000000+00:00"
    assert docker_time("0001-01-01T00:00:00Z") is None and docker_time(None) is None


@pytest.mark.docker
def test_a_containers_state_and_since(docker_client: TestClient, docker_service: OrchestratorService) -> None:
    run = start_run(docker_client, group_session(docker_client), trigger="group_message", speaker_user_id=OWNER)
    assert tool(docker_client, run["run_id"], "shell", command="true")["ok"]
    running = docker_client.get(f"/v1/users/{OWNER}/sandbox").json()
    assert running["backend"] == "docker" and running["state"] == "running"
    assert datetime.fromisoformat(running["since"]) <= datetime.fromisoformat(running["last_call_at"])
    docker_service.sandboxes.backends["docker"].stop(OWNER)
    stopped = docker_client.get(f"/v1/users/{OWNER}/sandbox").json()
    assert stopped["state"] == "stopped"  # the container stays (stopped), so does its time
    assert datetime.fromisoformat(stopped["since"]) >= datetime.fromisoformat(running["since"])
