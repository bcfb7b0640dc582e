"""`orchestrator build-image` against a real engine: the image exists, is labelled, runs as
an unprivileged user without agent code baked in, and a second build reuses it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import docker
import pytest

from orchestrator.sandboxes.image.compat import expected_agent_lock
from orchestrator.sandboxes.image.recipe import LABEL_AGENT_LOCK, LABEL_RECIPE, LABEL_ROLE
from tests.sandbox_image import ensure_sandbox_image, recipe_tag

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def run_in_image(image: str, code: str) -> str:
    """Run Python in the image the way sandboxes do: no network, read-only root, no caps."""
    client = docker.from_env()
    try:
        out = client.containers.run(
            image,
            ["-c", code],
            entrypoint="/opt/sandbox/venv/bin/python",
            user="100042:100042",
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            remove=True,
        )
    finally:
        client.close()
    return out.decode()


def test_image_is_labelled_unprivileged_and_has_no_agent_code() -> None:
    result = ensure_sandbox_image()
    client = docker.from_env()
    try:
        image = client.images.get(recipe_tag(result))
    finally:
        client.close()
    assert image.id == result.image_id
    assert image.labels[LABEL_ROLE] == "sandbox" and image.labels[LABEL_RECIPE] == result.recipe
    assert image.labels[LABEL_AGENT_LOCK] == expected_agent_lock()
    config = image.attrs["Config"]
    assert config["User"] == "sandbox"
    assert config["Entrypoint"] == ["/usr/local/bin/sandbox-entrypoint"]
    found = run_in_image(
        recipe_tag(result),
        "import importlib.util, os, sys; print(importlib.util.find_spec('sandbox_agent'), os.getuid(), "
        "sys.version_info[:2])",
    )
    assert found.split() == ["None", "100042", "(3,", "11)"]


def test_agent_dependencies_match_the_hosts_versions() -> None:
    result = ensure_sandbox_image()
    names = ["starlette", "uvicorn", "httptools", "pydantic", "psutil", "regex"]
    out = run_in_image(
        recipe_tag(result),
        f"from importlib.metadata import version; print(*(version(n) for n in {names!r}))",
    )
    assert out.split() == [version(n) for n in names]


def test_build_image_command_is_idempotent_and_says_so() -> None:
    result = ensure_sandbox_image()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "build-image", "--image", recipe_tag(result)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "reusing" in done.stdout and "up to date" in done.stdout
    assert result.image_id[:19] in done.stdout


def test_build_image_refuses_a_missing_base_image_clearly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "build-image", "--base-image", "no-such/base:never"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "not present locally" in done.stderr
