"""The sandbox image for docker tests: built (or reused) once per test session by the same
code as `orchestrator build-image`, so a fresh CI machine needs no manual step."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from functools import lru_cache

import docker

from orchestrator.sandboxes.image.build import BuildResult, BuildSources, ImageBuilder
from orchestrator.settings import Settings

# Read at import, before the tests' fixtures clear ORCH_* from the environment: a branch that
# changes the Dockerfile builds and tags its own image instead of re-tagging the shared default.
IMAGE = os.environ.get("ORCH_SANDBOX_IMAGE") or Settings().sandbox_image


@lru_cache(maxsize=1)
def ensure_sandbox_image() -> BuildResult:
    client = docker.from_env(timeout=900)
    try:
        builder = ImageBuilder(
            client, BuildSources.from_checkout(), image=IMAGE, progress=print
        )
        return builder.build()
    finally:
        client.close()


def recipe_tag(result: BuildResult) -> str:
    """The image by its recipe tag: stable even if another checkout re-tags `latest`."""
    repository = result.image.rpartition(":")[0] or result.image
    return f"{repository}:{result.recipe[:12]}"


def derived_image(engine: docker.DockerClient, source: str, tag: str, labels: Mapping[str, str]) -> str:
    """An image `FROM source` with `labels` added, tagged `tag`; built offline in a moment (no
    RUN step). Returns its id; the caller removes the tag."""
    lines = [f"FROM {source}", *(f'LABEL {key}="{value}"' for key, value in labels.items())]
    dockerfile = io.BytesIO(("\n".join(lines) + "\n").encode())
    image, _ = engine.images.build(fileobj=dockerfile, tag=tag, network_mode="none", rm=True)
    return str(image.id)
