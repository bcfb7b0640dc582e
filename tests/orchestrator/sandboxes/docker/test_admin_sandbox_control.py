"""The admin's hand on one user's docker sandbox through the API, against a real engine: a
pause freezes the container (`docker inspect` says Paused), a resume thaws the same one, a stop
stops it and the next call starts it again; CPU and memory set for the user are the
container's after a restart."""

from __future__ import annotations

import docker
import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.api_calls import start_run, tool
from tests.conftest import admin_headers
from tests.orchestrator.sandboxes.docker.test_lifecycle import the_container

pytestmark = [pytest.mark.docker, pytest.mark.slow]

USER = 31


def test_pause_resume_stop_and_resources_of_one_users_container(
    docker_client: TestClient, docker_service: OrchestratorService, engine: docker.DockerClient
) -> None:
    session = docker_client.post("/v1/sessions", json={"owner_user_id": USER, "channel": "web"}).json()["session_id"]
    run_id = start_run(docker_client, session, trigger="web")["run_id"]
    assert tool(docker_client, run_id, "write_file", path="kept.txt", content="kept")["ok"]
    container = the_container(engine, docker_service, USER)

    paused = docker_client.post(f"/v1/admin/users/{USER}/sandbox/pause", headers=admin_headers())
    assert paused.json() == {"user_id": USER, "state": "paused"}, paused.text
    container.reload()
    assert container.attrs["State"]["Paused"] is True
    assert docker_client.post(f"/v1/admin/users/{USER}/sandbox/pause", headers=admin_headers()).status_code == 409
    resumed = docker_client.post(f"/v1/admin/users/{USER}/sandbox/resume", headers=admin_headers())
    assert resumed.json()["state"] == "running", resumed.text
    container.reload()
    assert container.attrs["State"]["Paused"] is False and the_container(engine, docker_service, USER).id == container.id

    resources = docker_client.put(
        f"/v1/admin/users/{USER}/resources", json={"cpus": 0.5, "memory_mb": 256}, headers=admin_headers()
    )
    assert resources.status_code == 200, resources.text
    assert docker_client.post(f"/v1/admin/users/{USER}/sandbox/restart", headers=admin_headers()).json()["state"] == "running"
    restarted = the_container(engine, docker_service, USER)
    assert restarted.attrs["HostConfig"]["NanoCpus"] == 500_000_000
    assert restarted.attrs["HostConfig"]["Memory"] == 256 * 1024 * 1024

    assert docker_client.post(f"/v1/admin/users/{USER}/sandbox/stop", headers=admin_headers()).json()["state"] == "stopped"
    restarted.reload()
    assert restarted.status != "running"
    assert tool(docker_client, run_id, "read_file", path="kept.txt")["ok"]  # the next call starts it again
    assert the_container(engine, docker_service, USER).status == "running"
