"""The image's inputs in this source checkout: where its files are, and the agent's
dependencies pinned to what is installed here. Shared by the build (`build.py`) and the fit
check (`compat.py`), which must not import each other."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from orchestrator.sandboxes.image.recipe import (
    InstalledDistribution,
    Pin,
    canonical_name,
    lock_requirements,
    top_level_requirements,
)


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message says which and why."""


@dataclass(frozen=True)
class BuildSources:
    """Where the recipe's files live: a source checkout (the Dockerfile is at its top)."""

    root: Path

    @classmethod
    def from_checkout(cls, root: Path | None = None) -> BuildSources:
        root = (root or Path(__file__).resolve().parents[3]).resolve()
        sources = cls(root)
        if not sources.dockerfile.is_file():
            raise ImageBuildError(
                f"no Dockerfile at {sources.dockerfile}: build-image needs a source checkout "
                "of sandbox-orchestrator (the Dockerfile and images/ are not installed as a package)"
            )
        return sources

    @property
    def dockerfile(self) -> Path:
        return self.root / "Dockerfile"

    @property
    def entrypoint(self) -> Path:
        return self.root / "images" / "sandbox-entrypoint"

    @property
    def requirements_in(self) -> Path:
        return self.root / "images" / "sandbox-requirements.in"

    @property
    def workbench_lock(self) -> Path:
        """The user's python packages of the default image, pinned (not the agent's)."""
        return self.root / "images" / "workbench-requirements.txt"

    @property
    def base_script(self) -> Path:
        return self.root / "images" / "build-base.sh"

    @property
    def wheelhouse(self) -> Path:
        return self.root / ".wheelhouse"


def installed_distributions() -> dict[str, InstalledDistribution]:
    found: dict[str, InstalledDistribution] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical_name(name), InstalledDistribution(dist.version, tuple(dist.requires or ())))
    return found


def agent_pins(sources: BuildSources, installed: dict[str, InstalledDistribution] | None = None) -> tuple[Pin, ...]:
    """The agent's runtime dependencies, pinned to the versions installed here."""
    top = top_level_requirements(sources.requirements_in.read_text())
    return lock_requirements(top, installed if installed is not None else installed_distributions())
