"""The sandbox image for docker tests: built (or reused) once per test session by the same
code as `orchestrator build-image`, so a fresh CI machine needs no manual step."""

from __future__ import annotations

from functools import lru_cache

import docker

from orchestrator.image.build import BuildResult, BuildSources, ImageBuilder
from orchestrator.settings import Settings


@lru_cache(maxsize=1)
def ensure_sandbox_image() -> BuildResult:
    client = docker.from_env(timeout=900)
    try:
        builder = ImageBuilder(
            client, BuildSources.from_checkout(), image=Settings().sandbox_image, progress=print
        )
        return builder.build()
    finally:
        client.close()


def recipe_tag(result: BuildResult) -> str:
    """The image by its recipe tag: stable even if another checkout re-tags `latest`."""
    repository = result.image.rpartition(":")[0] or result.image
    return f"{repository}:{result.recipe[:12]}"
