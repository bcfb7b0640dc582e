"""The CI machine must provide a Docker engine: under ORCH_REQUIRE_DOCKER=1 this fails
instead of skipping when none answers."""

import pytest

from tests.conftest import docker_engine_problem


@pytest.mark.docker
def test_docker_engine_answers() -> None:
    assert docker_engine_problem() is None
