"""Fixtures for tests against a real Docker engine.

The image is built (or reused) once per session by the same code as `orchestrator build-image`.
Data dirs live under the tests' TEST_ROOT, not /tmp: a user's `tmp/{uid}` is mounted at /tmp in
the container, and a data dir under /tmp would nest every other mount inside it. Every container a
test creates carries its data dir's instance label and is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from fastapi.testclient import TestClient

from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, instance_id
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from tests.conftest import API_TOKEN, TEST_ROOT, make_settings
from tests.conftest import sandbox_runtime  # noqa: F401 - a fixture, re-exported for modules that import it from here
from tests.sandbox_image import ensure_sandbox_image, recipe_tag

TEST_BASE = TEST_ROOT / "docker"


def remove_containers(data_dir: Path) -> int:
    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance_id(data_dir)}"})
        for container in found:
            container.remove(force=True)
        return len(found)
    finally:
        client.close()


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    return recipe_tag(ensure_sandbox_image())


@pytest.fixture
def docker_data_dir() -> Iterator[Path]:
    TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(TEST_BASE, 0o711)
    base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    try:
        yield data
    finally:
        remove_containers(data)
        shutil.rmtree(base, ignore_errors=True)


def docker_settings(data_dir: Path, image: str, **overrides: object) -> Settings:
    values: dict[str, object] = {"backend": "docker", "sandbox_image": image, **overrides}
    return make_settings(data_dir, **values)


# The OCI runtimes a test runs its sandboxes under when it takes `sandbox_runtime` by
# `@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)`: runc, and gVisor (marked `runsc`).
RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]


@pytest.fixture
def docker_service(docker_data_dir: Path, sandbox_image: str, sandbox_runtime: str) -> Iterator[OrchestratorService]:
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, sandbox_runtime=sandbox_runtime))
    try:
        yield service
    finally:
        service.close()


@pytest.fixture
def docker_client(docker_service: OrchestratorService) -> Iterator[TestClient]:
    with TestClient(create_app(docker_service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
        yield client


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()
