"""The token never enters a docker sandbox, under runc and under gVisor (whose forwarder
relays the bytes over the Unix socket instead of handing the connection over): its request
arrives with the token, and inside the container it is nowhere (its environment, files under
every mount it has, /proc of every process it sees, the agent's answers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.orchestrator.credentials.test_credentials_live import World, secret_is_nowhere, world
from tests.orchestrator.sandboxes.docker.conftest import RUNTIMES

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def docker_world(sandbox_image: str, sandbox_runtime: str) -> Iterator[World]:
    with world(3, backend="docker", sandbox_image=sandbox_image, sandbox_runtime=sandbox_runtime) as made:
        yield made


@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)
def test_the_token_is_nowhere_in_a_docker_sandbox(docker_world: World) -> None:
    secret_is_nowhere(docker_world, ["--mounts", "/tmp", "/root", "/home"])
