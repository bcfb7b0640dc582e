"""Which backend runs sandboxes (SPEC §13, ORCH_BACKEND): `docker`, `process`, or `auto` —
docker when an engine answers and the sandbox image exists, else process."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.settings import Settings


@dataclass(frozen=True)
class BackendChoice:
    default: str  # the backend of users without an override
    docker: bool  # whether the docker backend is registered (also for per-user overrides)
    reason: str


def choose_backend(setting: str, *, engine_problem: str | None, image_present: bool, image: str) -> BackendChoice:
    """Pure: the choice from the setting and what the host offers."""
    if setting == "process":
        return BackendChoice("process", False, "ORCH_BACKEND=process")
    if setting == "docker":
        if engine_problem is not None:
            return BackendChoice("docker", False, f"ORCH_BACKEND=docker, but no Docker engine answers: {engine_problem}")
        if not image_present:
            return BackendChoice("docker", True, f"ORCH_BACKEND=docker, but the image {image} is not built yet")
        return BackendChoice("docker", True, "ORCH_BACKEND=docker")
    if engine_problem is not None:
        return BackendChoice("process", False, f"auto: no Docker engine answers ({engine_problem})")
    if not image_present:
        return BackendChoice("process", False, f"auto: the sandbox image {image} is not built (orchestrator build-image)")
    return BackendChoice("docker", True, "auto: a Docker engine answers and the sandbox image exists")


def detect_backend(settings: Settings) -> BackendChoice:
    """The choice for this host; asks the engine only when the setting can use it."""
    from orchestrator.backends.docker import engine_problem, image_present

    if settings.backend == "process":
        return choose_backend("process", engine_problem=None, image_present=False, image=settings.sandbox_image)
    problem = engine_problem()
    present = problem is None and image_present(settings.sandbox_image)
    return choose_backend(settings.backend, engine_problem=problem, image_present=present, image=settings.sandbox_image)
