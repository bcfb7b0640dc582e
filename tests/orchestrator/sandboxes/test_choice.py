"""ORCH_BACKEND: which backend runs sandboxes, decided from the setting and the host."""

from __future__ import annotations

from orchestrator.sandboxes.choice import BackendChoice, choose_backend
from orchestrator.sandboxes.image.compat import ImageFit


def choose(setting: str, problem: str | None = None, image: ImageFit = ImageFit.FITS) -> BackendChoice:
    return choose_backend(setting, engine_problem=problem, image=image, image_name="img:1")


def test_auto_uses_docker_only_with_an_engine_and_an_image_that_fits() -> None:
    assert (choose("auto").default, choose("auto").docker) == ("docker", True)
    no_image = choose("auto", image=ImageFit.ABSENT)
    assert (no_image.default, no_image.docker) == ("process", False)
    assert "img:1" in no_image.reason and "build-image" in no_image.reason
    stale = choose("auto", image=ImageFit.STALE)
    assert (stale.default, stale.docker) == ("process", False)
    assert "img:1" in stale.reason and "other agent dependencies" in stale.reason and "build-image" in stale.reason
    no_engine = choose("auto", problem="connection refused", image=ImageFit.ABSENT)
    assert (no_engine.default, no_engine.docker) == ("process", False) and "connection refused" in no_engine.reason


def test_an_explicit_setting_is_kept_and_explained() -> None:
    assert (choose("process").default, choose("process").docker) == ("process", False)
    assert (choose("docker").default, choose("docker").docker) == ("docker", True)
    # docker without its image, or with one that does not fit: registered, so calls say how to fix it
    missing = choose("docker", image=ImageFit.ABSENT)
    assert (missing.default, missing.docker) == ("docker", True) and "not built" in missing.reason
    stale = choose("docker", image=ImageFit.STALE)
    assert (stale.default, stale.docker) == ("docker", True) and "build-image" in stale.reason
    # docker without an engine: not registered, so calls fail with sandbox_unavailable
    down = choose("docker", problem="no socket", image=ImageFit.ABSENT)
    assert (down.default, down.docker) == ("docker", False) and "no socket" in down.reason
