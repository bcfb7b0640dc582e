"""ORCH_BACKEND against the real host: auto picks docker when the image exists and fits this
orchestrator, and process when it does not; an explicit docker setting with an image built for
other agent dependencies refuses calls with the fix; /healthz says which and why; a per-user
override routes one user to the other backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN, admin_headers
from tests.orchestrator.sandboxes.docker.conftest import docker_settings
from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, instance_id
from orchestrator.sandboxes.image.recipe import LABEL_AGENT_LOCK, LABEL_ROLE, ROLE_SANDBOX
from tests.api_calls import group_session, start_run, tool
from orchestrator.sandboxes.image.build import BuildSources, ImageBuilder
from tests.sandbox_image import IMAGE, derived_image, ensure_sandbox_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def api(service: OrchestratorService) -> TestClient:
    return TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"})


def test_auto_picks_docker_when_the_image_exists(docker_data_dir: Path, sandbox_image: str) -> None:
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, backend="auto"))
    with api(service) as client:
        health = client.get("/healthz", headers=admin_headers()).json()
    assert health["backend"] == "docker" and health["backends_available"] == ["docker", "process"]
    assert "image fits" in health["backend_reason"]


@pytest.fixture(scope="module")
def foreign_image() -> Iterator[str]:
    """A sandbox image as another checkout would label it: other agent dependencies."""
    name = "sandbox-orchestrator/sandbox:test-foreign-lock"
    engine = docker.from_env()
    try:
        derived_image(engine, ensure_sandbox_image().image_id, name, {LABEL_ROLE: ROLE_SANDBOX, LABEL_AGENT_LOCK: "0" * 64})
        yield name
        engine.images.remove(name, force=True)
    finally:
        engine.close()


def test_auto_falls_back_to_process_with_an_image_for_other_agent_dependencies(
    docker_data_dir: Path, foreign_image: str
) -> None:
    service = OrchestratorService(docker_settings(docker_data_dir, foreign_image, backend="auto"))
    with api(service) as client:
        health = client.get("/healthz", headers=admin_headers()).json()
        assert health["backend"] == "process" and foreign_image in health["backend_reason"]
        assert "build-image" in health["backend_reason"]
        run = start_run(client, group_session(client), trigger="web")
        assert tool(client, run["run_id"], "shell", command="echo hi")["result"]["stdout"] == "hi\n"


def test_docker_refuses_an_image_for_other_agent_dependencies_with_the_fix(
    docker_data_dir: Path, foreign_image: str
) -> None:
    service = OrchestratorService(docker_settings(docker_data_dir, foreign_image))
    with api(service) as client:
        assert client.get("/healthz", headers=admin_headers()).json()["backend"] == "docker"
        run = start_run(client, group_session(client), trigger="web")
        answer = tool(client, run["run_id"], "read_file", path="x.txt")
    assert answer["ok"] is False and answer["error"]["code"] == "sandbox_unavailable"
    assert "other agent dependencies" in answer["error"]["message"]
    assert "build-image" in answer["error"]["message"]
    engine = docker.from_env()
    try:  # refused before any container was made from it
        made = engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance_id(docker_data_dir)}"})
    finally:
        engine.close()
    assert made == []


def test_auto_falls_back_to_process_without_the_image(docker_data_dir: Path) -> None:
    missing = "sandbox-orchestrator/sandbox:never-built"
    service = OrchestratorService(docker_settings(docker_data_dir, missing, backend="auto"))
    with api(service) as client:
        health = client.get("/healthz", headers=admin_headers()).json()
        assert health["backend"] == "process" and health["backends_available"] == ["process"]
        assert missing in health["backend_reason"]
        run = start_run(client, group_session(client), trigger="web")
        assert tool(client, run["run_id"], "shell", command="echo hi")["result"]["stdout"] == "hi\n"
    assert service.sandboxes.backends.get("docker") is None


def test_a_build_never_reuses_an_image_derived_from_the_sandbox_image(foreign_image: str) -> None:
    """An image built FROM the sandbox image inherits its recipe label; with other agent
    dependencies it must not be what `build-image` finds and tags as the sandbox image."""
    engine = docker.from_env(timeout=900)
    try:
        foreign_id = engine.images.get(foreign_image).id
        result = ImageBuilder(engine, BuildSources.from_checkout(), image=IMAGE, progress=lambda _: None).build()
        assert result.image_id != foreign_id
        assert engine.images.get(IMAGE).id == result.image_id == ensure_sandbox_image().image_id
    finally:
        engine.close()
