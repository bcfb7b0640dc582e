"""Which backend runs sandboxes (ORCH_BACKEND): `docker`, `process`, `kubernetes`, or `auto` —
docker when an engine answers and the sandbox image exists and fits this orchestrator, else
process. `auto` never picks kubernetes: a cluster is the operator's explicit choice."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.sandboxes.image.compat import ImageFit, expected_agent_lock, image_fit, stale_image_message
from orchestrator.settings import SandboxSettings


@dataclass(frozen=True)
class BackendChoice:
    default: str  # the backend of users without an override
    docker: bool  # whether the docker backend is registered (also for per-user overrides)
    reason: str
    kubernetes: bool = False  # whether the kubernetes backend is registered


def kubernetes_choice(cluster_problem: str | None) -> BackendChoice:
    """Pure: ORCH_BACKEND=kubernetes. Registered even when the cluster does not answer now, so
    that calls say why (and work once it does)."""
    if cluster_problem is not None:
        return BackendChoice("kubernetes", False, f"ORCH_BACKEND=kubernetes, but {cluster_problem}", kubernetes=True)
    return BackendChoice("kubernetes", False, "ORCH_BACKEND=kubernetes", kubernetes=True)


def choose_backend(setting: str, *, engine_problem: str | None, image: ImageFit, image_name: str) -> BackendChoice:
    """Pure: the choice from the setting and what the host offers."""
    if setting == "process":
        return BackendChoice("process", False, "ORCH_BACKEND=process")
    if setting == "docker":
        if engine_problem is not None:
            return BackendChoice("docker", False, f"ORCH_BACKEND=docker, but no Docker engine answers: {engine_problem}")
        # Registered either way, so that calls say how to fix it.
        if image is ImageFit.ABSENT:
            return BackendChoice("docker", True, f"ORCH_BACKEND=docker, but the image {image_name} is not built yet")
        if image is ImageFit.STALE:
            return BackendChoice("docker", True, f"ORCH_BACKEND=docker, but {stale_image_message(image_name)}")
        return BackendChoice("docker", True, "ORCH_BACKEND=docker")
    if engine_problem is not None:
        return BackendChoice("process", False, f"auto: no Docker engine answers ({engine_problem})")
    if image is ImageFit.ABSENT:
        return BackendChoice("process", False, f"auto: the sandbox image {image_name} is not built (orchestrator build-image)")
    if image is ImageFit.STALE:
        return BackendChoice("process", False, f"auto: {stale_image_message(image_name)}")
    return BackendChoice("docker", True, "auto: a Docker engine answers and the sandbox image fits")


def engine_problem(timeout: float = 3.0) -> str | None:
    """None when a Docker engine answers, else why not."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
        return None
    except DockerException as exc:
        return str(exc)


def image_labels(image: str, timeout: float = 3.0) -> dict[str, str] | None:
    """The image's labels; None when it is absent (or the engine does not answer)."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    try:
        client = docker.from_env(timeout=timeout)
        try:
            return dict(client.images.get(image).labels or {})
        finally:
            client.close()
    except (DockerException, ImageNotFound):
        return None


def detect_backend(settings: SandboxSettings) -> BackendChoice:
    """The choice for this host; asks the engine only when the setting can use it."""
    name = settings.image
    if settings.backend == "kubernetes":
        from orchestrator.sandboxes.kubernetes_api import cluster_problem

        return kubernetes_choice(cluster_problem(settings.kubernetes))
    if settings.backend == "process":
        return choose_backend("process", engine_problem=None, image=ImageFit.ABSENT, image_name=name)
    problem = engine_problem()
    labels = image_labels(name) if problem is None else None
    fit = image_fit(labels, expected_agent_lock())
    return choose_backend(settings.backend, engine_problem=problem, image=fit, image_name=name)
