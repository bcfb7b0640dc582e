"""Backend overrides (issue 12 item 8): only the admin token may set a user's backend, and no
override, set now or stored before, goes below the operator's isolation floor."""

from __future__ import annotations

import socket

import pytest
from fastapi.testclient import TestClient

from tests.api_calls import group_session, start_run, tool
from tests.conftest import admin_headers
from tests.orchestrator.sandboxes.docker.conftest import (  # noqa: F401 - fixtures
    docker_client,
    docker_data_dir,
    docker_service,
    sandbox_image,
)

OWNER = 17


def in_docker(client: TestClient, run_id: str) -> bool:
    """Whether the run's calls ran in a container: its hostname is not the host's, and the
    admin view lists the user's sandbox under docker."""
    answer = tool(client, run_id, "shell", command="hostname")
    assert answer["ok"] is True, answer
    sandboxes = client.get("/v1/admin/sandboxes", headers=admin_headers()).json()["sandboxes"]
    backends = {s["backend"] for s in sandboxes if s["user_id"] == OWNER and s["state"] == "running"}
    return answer["result"]["stdout"].strip() != socket.gethostname() and backends == {"docker"}


@pytest.mark.docker
def test_item8_bot_token_cannot_switch_a_user_to_the_process_backend(docker_client: TestClient, docker_service) -> None:
    response = docker_client.put(f"/v1/users/{OWNER}", json={"backend": "process"})
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "forbidden"
    # Not even the admin may go below the operator's floor (ORCH_BACKEND=docker).
    response = docker_client.put(f"/v1/users/{OWNER}", json={"backend": "process"}, headers=admin_headers())
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "below_isolation_floor"
    # An override stored before (an older server, a hand-edited DB) is not obeyed either.
    docker_service.users.upsert(OWNER, display_name=None, backend="process")
    assert docker_service.sandboxes.backend_name_for(OWNER) == "docker"
    run = start_run(docker_client, group_session(docker_client), trigger="web")
    assert in_docker(docker_client, run["run_id"])
    # A display name from the bot still works, and keeps the (admin's) backend as it was.
    response = docker_client.put(f"/v1/users/{OWNER}", json={"display_name": "Ann"})
    assert response.status_code == 200 and response.json()["backend"] == "process"


def test_isolation_order_is_docker_then_bwrap_then_process() -> None:
    from orchestrator.sandboxes.router import effective_backend, isolation_rank

    assert isolation_rank("docker", "none") > isolation_rank("process", "bwrap") > isolation_rank("process", "none")
    available = {"docker", "process"}
    assert effective_backend("process", "docker", available, process_sandbox="bwrap") == "docker"
    assert effective_backend("docker", "process", available, process_sandbox="none") == "docker"
    assert effective_backend(None, "process", available, process_sandbox="none") == "process"
    assert effective_backend("auto", "docker", available, process_sandbox="none") == "docker"
    assert effective_backend("docker", "process", {"process"}, process_sandbox="none") == "process"


def test_item8_bot_token_cannot_set_any_backend_and_admin_can_raise_it(client: TestClient) -> None:
    assert client.put(f"/v1/users/{OWNER}", json={"backend": "docker"}).status_code == 403
    # clearing an override the admin set is a change of backend too
    assert client.put(f"/v1/users/{OWNER}", json={"display_name": "Ann", "backend": None}).status_code == 403
    assert client.put(f"/v1/users/{OWNER}", json={"display_name": "Ann"}).status_code == 200
    response = client.put(f"/v1/users/{OWNER}", json={"backend": "docker"}, headers=admin_headers())
    assert response.status_code == 200 and response.json()["backend"] == "docker"
