"""The group scenario of the sandbox agent's tests, now with every user in their own
container: the same assertions hold, and each runtime user got exactly one container."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.orchestrator.tools import test_container_tools_api as scenario

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def containers_by_user(service: OrchestratorService) -> dict[int, str]:
    statuses = service.sandboxes.status()
    docker_statuses = [s for s in statuses if s.backend == "docker"]
    assert len(docker_statuses) == len({s.user_id for s in docker_statuses})  # one container per user
    assert all(s.backend == "docker" for s in statuses)  # nothing fell back to the process backend
    return {s.user_id: s.detail["container_id"] for s in docker_statuses}  # type: ignore[index]


def test_group_scenario_in_containers(
    docker_client: TestClient, docker_service: OrchestratorService, docker_data_dir: Path
) -> None:
    scenario.test_group_scenario_member_writes_owner_cannot_read_member_cannot_read_owner_upload(
        docker_client, docker_data_dir
    )
    assert set(containers_by_user(docker_service)) == {scenario.OWNER, scenario.MEMBER}


def test_group_workspace_is_shared_between_members_containers(
    docker_client: TestClient, docker_service: OrchestratorService, docker_data_dir: Path
) -> None:
    scenario.test_relative_paths_start_in_the_runs_workdir_and_the_group_workspace_is_shared(
        docker_client, docker_data_dir
    )
    assert set(containers_by_user(docker_service)) == {scenario.OWNER, scenario.MEMBER}


def test_owner_mode_runs_a_members_turn_in_the_owners_container(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    scenario.test_owner_mode_routes_to_the_owners_sandbox(docker_client, docker_service)
    assert set(containers_by_user(docker_service)) == {scenario.OWNER}
