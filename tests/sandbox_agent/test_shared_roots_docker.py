"""The shared-root attacks of test_shared_roots.py with every user in their own container."""

from __future__ import annotations

import os

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.orchestrator.sandboxes.docker.conftest import docker_client, docker_data_dir, docker_service, sandbox_image  # noqa: F401
from tests.sandbox_agent import test_shared_roots as scenario

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need a root orchestrator"),
]


@pytest.mark.parametrize("where", ["group", "share"])
def test_item7_shared_symlink_to_private_root_is_refused(
    docker_client: TestClient, docker_service: OrchestratorService, where: str
) -> None:
    scenario.shared_links_to_private_roots_are_refused(docker_client, docker_service, where)


def test_item7_shared_directories_are_sticky(docker_client: TestClient, docker_service: OrchestratorService) -> None:
    scenario.shared_directories_are_sticky(docker_client, docker_service)


def test_item14_non_utf8_names_in_a_shared_directory_round_trip(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    scenario.non_utf8_names_round_trip(docker_client, docker_service)
