"""What the sandbox image is made of, decided without touching Docker or the network.

The image is identified by a *recipe hash* over everything that goes into it (the Dockerfile,
the entrypoint, the pinned wheel list and the base image id). `orchestrator build-image`
reuses an image whose label carries the same hash, so a second build is a no-op.

Pins come from the host's installed distributions: the agent inside the container then runs
the same versions as the `process` backend on the host, and the wheelhouse needs no resolver.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement

LABEL_ROLE = "org.sandbox-orchestrator.role"
LABEL_RECIPE = "org.sandbox-orchestrator.recipe"
LABEL_AGENT_LOCK = "org.sandbox-orchestrator.agent-lock"  # see orchestrator/sandboxes/image/compat.py
ROLE_SANDBOX = "sandbox"

# Bump when the way the recipe is computed changes.
RECIPE_FORMAT = "1"


class RecipeError(ValueError):
    """The host cannot provide what the image needs (e.g. a dependency is not installed)."""


def canonical_name(name: str) -> str:
    """PEP 503 normalization: `Typing_Extensions` and `typing-extensions` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, order=True)
class Pin:
    name: str  # canonical
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def matches_wheel(self, filename: str) -> bool:
        """True for this project's wheel at this version (`Name_X-1.0-py3-none-any.whl`)."""
        if not filename.endswith(".whl"):
            return False
        parts = filename[: -len(".whl")].split("-")
        return len(parts) >= 5 and canonical_name(parts[0]) == self.name and parts[1] == self.version


@dataclass(frozen=True)
class InstalledDistribution:
    """The two facts about an installed distribution that pinning needs."""

    version: str
    requires: tuple[str, ...]  # Requires-Dist lines, with markers


def top_level_requirements(text: str) -> tuple[str, ...]:
    """Names from a requirements `.in` file: one per line, `#` comments and blank lines ignored."""
    names = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.append(canonical_name(Requirement(line).name))
    return tuple(names)


def lock_requirements(
    top_level: Iterable[str],
    installed: Mapping[str, InstalledDistribution],
    environment: Mapping[str, str] | None = None,
) -> tuple[Pin, ...]:
    """Pin `top_level` and everything it requires (under `environment`'s markers, no extras)
    to the installed versions. `installed` is keyed by canonical name."""
    env = dict(environment or default_environment())
    env.setdefault("extra", "")
    pins: dict[str, Pin] = {}
    pending = [canonical_name(name) for name in top_level]
    while pending:
        name = pending.pop()
        if name in pins:
            continue
        dist = installed.get(name)
        if dist is None:
            raise RecipeError(
                f"the sandbox agent needs {name!r}, which is not installed on the host; "
                "install the orchestrator with its dependencies first (make install)"
            )
        pins[name] = Pin(name, dist.version)
        for line in dist.requires:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            pending.append(canonical_name(req.name))
    return tuple(sorted(pins.values()))


def pinned_requirements(text: str) -> tuple[Pin, ...]:
    """`name==version` lines (a lock file such as images/workbench-requirements.txt); `#`
    comments and blank lines ignored; anything else is refused."""
    pins = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise RecipeError(f"not a pinned requirement (name==version): {line!r}")
        pins.append(Pin(canonical_name(name.strip()), version.strip()))
    return tuple(sorted(set(pins)))


def lock_text(pins: Iterable[Pin]) -> str:
    return "".join(f"{pin.requirement}\n" for pin in sorted(pins))


def agent_lock_digest(pins: Iterable[Pin]) -> str:
    """The digest of the agent's pinned dependencies an image is labelled with (`compat.py`)."""
    return hashlib.sha256(lock_text(pins).encode()).hexdigest()


def missing_wheels(pins: Iterable[Pin], filenames: Iterable[str]) -> tuple[Pin, ...]:
    names = list(filenames)
    return tuple(pin for pin in pins if not any(pin.matches_wheel(f) for f in names))


def download_rounds(pins: Iterable[Pin]) -> tuple[tuple[Pin, ...], ...]:
    """The pins split so that no round names a project twice: the agent's lock and the user's
    workbench may pin one project at two versions (each goes to its own Python), and one
    `pip download` of both refuses them as a conflict."""
    rounds: list[dict[str, Pin]] = []
    for pin in sorted(set(pins)):
        free = next((taken for taken in rounds if pin.name not in taken), None)
        if free is None:
            free = {}
            rounds.append(free)
        free[pin.name] = pin
    return tuple(tuple(sorted(taken.values())) for taken in rounds)


def image_recipe(*, dockerfile: str, entrypoint: str, lock: str, base_image_id: str) -> str:
    """The recipe hash that labels the sandbox image."""
    digest = hashlib.sha256()
    for part in (RECIPE_FORMAT, dockerfile, entrypoint, lock, base_image_id):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()
