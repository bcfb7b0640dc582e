"""The token never enters a docker sandbox: its request arrives with the token, and inside
the container it is nowhere (its environment, files under every mount it has, /proc of every
process it sees, the agent's answers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.orchestrator.credentials.test_credentials_live import World, secret_is_nowhere, world

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def docker_world(sandbox_image: str) -> Iterator[World]:
    with world(backend="docker", sandbox_image=sandbox_image) as made:
        yield made


def test_the_token_is_nowhere_in_a_docker_sandbox(docker_world: World) -> None:
    secret_is_nowhere(docker_world, ["--mounts", "/tmp", "/root", "/home"])
