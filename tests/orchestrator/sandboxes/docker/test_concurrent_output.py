"""Issue 14 item 15 with a container: concurrent `shell` calls in one docker sandbox, under
load, never claim output they lost (the scenario of
`tests/orchestrator/sandboxes/test_concurrent_output.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_env import Served, serving
from tests.orchestrator.sandboxes.docker.conftest import docker_settings
from tests.orchestrator.sandboxes.test_concurrent_output import STRESSED, concurrent_calls_keep_their_output

pytestmark = [pytest.mark.docker]


@pytest.fixture
def contained(docker_data_dir: Path, sandbox_image: str) -> Iterator[Served]:
    with serving(docker_settings(docker_data_dir, sandbox_image, **STRESSED)) as served:
        yield served


def test_item15_concurrent_shell_calls_keep_their_output_in_a_container(contained: Served) -> None:
    concurrent_calls_keep_their_output(*contained)
