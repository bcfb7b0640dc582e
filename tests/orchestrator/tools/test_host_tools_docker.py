"""The host tools' acceptance tests with every user in their own Docker container: the host
pre-check gives the same answers as on the process backend, before any container exists."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.orchestrator.sandboxes.docker.conftest import (  # noqa: F401 - fixtures
    docker_client,
    docker_data_dir,
    docker_service,
    sandbox_image,
)
from tests.orchestrator.tools import test_host_tools_api as scenario

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_member_in_owners_group_session_in_containers(docker_client: TestClient, docker_service: OrchestratorService) -> None:
    scenario.test_member_in_owners_group_session_acceptance(docker_client, docker_service)
    statuses = docker_service.sandboxes.status()
    assert {s.user_id for s in statuses} == {scenario.OWNER, scenario.MEMBER}
    assert all(s.backend == "docker" for s in statuses)


def test_the_pre_check_answers_before_any_container_is_created(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    scenario.test_the_pre_check_answers_before_any_sandbox_is_asked(docker_client, docker_service)
