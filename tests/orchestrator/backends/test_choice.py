"""ORCH_BACKEND: which backend runs sandboxes, decided from the setting and the host."""

from __future__ import annotations

from orchestrator.backends.choice import choose_backend


def choose(setting: str, problem: str | None = None, image: bool = True):  # type: ignore[no-untyped-def]
    return choose_backend(setting, engine_problem=problem, image_present=image, image="img:1")


def test_auto_uses_docker_only_with_an_engine_and_the_image() -> None:
    assert (choose("auto").default, choose("auto").docker) == ("docker", True)
    no_image = choose("auto", image=False)
    assert (no_image.default, no_image.docker) == ("process", False)
    assert "img:1" in no_image.reason and "build-image" in no_image.reason
    no_engine = choose("auto", problem="connection refused", image=False)
    assert (no_engine.default, no_engine.docker) == ("process", False) and "connection refused" in no_engine.reason


def test_an_explicit_setting_is_kept_and_explained() -> None:
    assert (choose("process").default, choose("process").docker) == ("process", False)
    assert (choose("docker").default, choose("docker").docker) == ("docker", True)
    # docker without its image: registered, so calls say how to fix it
    missing = choose("docker", image=False)
    assert (missing.default, missing.docker) == ("docker", True) and "not built" in missing.reason
    # docker without an engine: not registered, so calls fail with sandbox_unavailable
    down = choose("docker", problem="no socket", image=False)
    assert (down.default, down.docker) == ("docker", False) and "no socket" in down.reason
