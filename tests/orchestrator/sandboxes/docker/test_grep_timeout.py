"""The image has the agent's `regex` engine (from the wheelhouse): a backtracking grep in a
container answers `timeout` and the container keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN
from tests.orchestrator.sandboxes.docker.conftest import docker_settings
from tests.orchestrator.tools.test_grep_timeout_api import a_backtracking_grep_times_out_while_the_sandbox_serves

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def grep_docker_client(docker_data_dir: Path, sandbox_image: str) -> Iterator[TestClient]:
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, grep_timeout_s=2))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client
        assert {s.backend for s in service.sandboxes.status()} == {"docker"}
    finally:
        service.close()


def test_a_backtracking_grep_times_out_in_a_container(grep_docker_client: TestClient) -> None:
    a_backtracking_grep_times_out_while_the_sandbox_serves(grep_docker_client)
