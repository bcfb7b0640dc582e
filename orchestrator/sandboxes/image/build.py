"""`orchestrator build-image`: the sandbox image, built offline (docs/docker.md).

Three steps, each reusing what exists:
1. the base image: `images/build-base.sh` (debootstrap + docker import), unless a base is given;
2. the wheelhouse: the agent's pinned dependencies as cp311 manylinux wheels in `.wheelhouse/`,
   downloaded once on the host (PyPI is reachable from the host, never from a build);
3. `docker build --network none` of the top-level Dockerfile, labelled with the recipe hash.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, BuildError, ImageNotFound

from mounts.fs.lock import flocked
from orchestrator.sandboxes.image.checkout import BuildSources, ImageBuildError, agent_pins, installed_distributions
from orchestrator.sandboxes.image.recipe import (
    LABEL_AGENT_LOCK,
    LABEL_RECIPE,
    LABEL_ROLE,
    ROLE_SANDBOX,
    Pin,
    agent_lock_digest,
    download_rounds,
    image_recipe,
    lock_requirements,
    lock_text,
    missing_wheels,
    pinned_requirements,
)

Progress = Callable[[str], None]

# Debian bookworm ships glibc 2.36: every manylinux tag up to that fits. pip does not expand
# a `--platform` to older glibc tags by itself, so all of them are named.
GLIBC_MINOR_MAX = 36
LEGACY_MANYLINUX = ("manylinux2014", "manylinux2010", "manylinux1")
TARGET_PYTHON = "3.11"
TARGET_ABI = "cp311"


def platform_args(machine: str) -> list[str]:
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR_MAX, 4, -1)]
    tags += [f"{legacy}_{machine}" for legacy in LEGACY_MANYLINUX]
    return [arg for tag in tags for arg in ("--platform", tag)]


@dataclass(frozen=True)
class BuildResult:
    image: str
    image_id: str
    recipe: str
    base_image: str
    built: bool  # False: an image with this recipe existed and was reused
    seconds: float


def base_cache_dir() -> Path:
    """Where downloaded .debs are kept between base-image builds."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sandbox-orchestrator" / "debootstrap"


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Serialize builds of one checkout (two test sessions, or a test and a developer)."""
    path.parent.mkdir(parents=True, exist_ok=True)  # the wheelhouse, with the usual mode
    with flocked(path, exclusive=True):
        yield


class ImageBuilder:
    def __init__(
        self,
        client: docker.DockerClient,
        sources: BuildSources,
        *,
        image: str,
        progress: Progress = lambda _line: None,
    ) -> None:
        self.client = client
        self.sources = sources
        self.image = image
        self.progress = progress

    # step 1 ---------------------------------------------------------------------------
    def ensure_base(self, base_image: str | None = None) -> tuple[str, str]:
        """(reference, id) of the base image; builds the local Debian base when none is given."""
        if base_image:
            try:
                found = self.client.images.get(base_image)
            except ImageNotFound:
                raise ImageBuildError(
                    f"base image {base_image!r} is not present locally (registries may be unreachable); "
                    "omit --base-image to build a local Debian base"
                ) from None
            self.progress(f"[1/3] base image: using {base_image}")
            return base_image, found.id
        self.progress("[1/3] base image: local Debian bookworm via debootstrap (images/build-base.sh)")
        env = dict(os.environ)
        # The script's default cache lives under $HOME, which a CI environment may not set.
        env.setdefault("SANDBOX_BASE_CACHE", str(base_cache_dir()))
        proc = subprocess.Popen(
            ["bash", str(self.sources.base_script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            self.progress("      " + line.rstrip())
        out = proc.stdout.read().strip().splitlines()
        if proc.wait() != 0 or not out:
            raise ImageBuildError(f"images/build-base.sh failed (exit {proc.returncode}); see the lines above")
        reference = out[-1]
        return reference, self.client.images.get(reference).id

    # step 2 ---------------------------------------------------------------------------
    def pins(self) -> tuple[tuple[Pin, ...], Pin]:
        """(the agent's pinned dependencies, the pip used to install them)."""
        installed = installed_distributions()
        return agent_pins(self.sources, installed), lock_requirements(["pip"], installed)[0]

    def workbench_pins(self) -> tuple[Pin, ...]:
        """The user's python packages of the image (images/workbench-requirements.txt)."""
        return pinned_requirements(self.sources.workbench_lock.read_text())

    def ensure_wheelhouse(self, pins: tuple[Pin, ...], pip: Pin, workbench: tuple[Pin, ...] = ()) -> Path:
        wheelhouse = self.sources.wheelhouse
        wheelhouse.mkdir(exist_ok=True)
        wanted = tuple(sorted({*pins, pip, *workbench}))
        missing = missing_wheels(wanted, os.listdir(wheelhouse))
        if not missing:
            self.progress(f"[2/3] wheelhouse: all {len(wanted)} wheels present in {wheelhouse}")
        else:
            self.progress(f"[2/3] wheelhouse: downloading {len(missing)} of {len(wanted)} wheels into {wheelhouse}")
            for pins_of_round in download_rounds(missing):
                self._download(pins_of_round, wheelhouse)
            still = missing_wheels(wanted, os.listdir(wheelhouse))
            if still:
                raise ImageBuildError(
                    "no cp311 manylinux wheel for: " + ", ".join(p.requirement for p in still)
                )
        (wheelhouse / "requirements.txt").write_text(lock_text(pins))
        (wheelhouse / "workbench.txt").write_text(lock_text(workbench))
        return wheelhouse

    def _download(self, pins: tuple[Pin, ...], dest: Path) -> None:
        machine = platform.machine()
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:",
            *platform_args(machine),
            "--python-version", TARGET_PYTHON, "--implementation", "cp",
            "--abi", TARGET_ABI, "--abi", "abi3", "--abi", "none",
            "--dest", str(dest),
            *(pin.requirement for pin in pins),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageBuildError(f"pip download failed:\n{done.stderr.strip()[-2000:]}")

    # step 3 ---------------------------------------------------------------------------
    def find_recipe_image(self, recipe: str, agent_lock: str) -> str | None:
        """The image built from `recipe`, if any. An image built FROM it (an operator's
        derivative, another checkout's) inherits the recipe label: the agent lock it carries
        must be the recipe's too, or it is not ours to tag."""
        labels = [f"{LABEL_ROLE}={ROLE_SANDBOX}", f"{LABEL_RECIPE}={recipe}", f"{LABEL_AGENT_LOCK}={agent_lock}"]
        found = self.client.images.list(filters={"label": labels})
        return found[0].id if found else None

    def build(self, *, base_image: str | None = None, force: bool = False) -> BuildResult:
        started = time.monotonic()
        with _exclusive(self.sources.wheelhouse / ".build.lock"):
            base_ref, base_id = self.ensure_base(base_image)
            pins, pip = self.pins()
            workbench = self.workbench_pins()
            recipe = image_recipe(
                dockerfile=self.sources.dockerfile.read_text(),
                entrypoint=self.sources.entrypoint.read_text(),
                lock=lock_text((*pins, pip)) + "# the user's python\n" + lock_text(workbench),
                base_image_id=base_id,
            )
            existing = None if force else self.find_recipe_image(recipe, agent_lock_digest(pins))
            if existing is not None:
                self.progress("[2/3] wheelhouse: not needed (the image exists)")
                self._tag(existing, recipe)
                self.progress(f"[3/3] image: reusing {self.image} ({existing[:19]}, recipe {recipe[:12]})")
                return BuildResult(self.image, existing, recipe, base_ref, False, time.monotonic() - started)
            self.ensure_wheelhouse(pins, pip, workbench)
            self.progress(f"[3/3] image: docker build --network none -> {self.image} (recipe {recipe[:12]})")
            image_id = self._docker_build(base_ref, recipe, agent_lock_digest(pins))
            self._tag(image_id, recipe)
            self.progress(f"      built {self.image} ({image_id[:19]}) in {time.monotonic() - started:.1f} s")
            return BuildResult(self.image, image_id, recipe, base_ref, True, time.monotonic() - started)

    def _docker_build(self, base_ref: str, recipe: str, agent_lock: str) -> str:
        image_id: str | None = None
        try:
            stream = self.client.api.build(
                path=str(self.sources.root),
                dockerfile="Dockerfile",
                buildargs={"BASE_IMAGE": base_ref, "RECIPE": recipe, "AGENT_LOCK": agent_lock},
                network_mode="none",
                pull=False,
                rm=True,
                forcerm=True,
                decode=True,
            )
            for chunk in stream:
                if "error" in chunk:
                    raise ImageBuildError(f"docker build failed: {chunk['error'].strip()}")
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
                text = chunk.get("stream", "").rstrip()
                if text.startswith("Step ") or text.startswith("Successfully built"):
                    self.progress("      " + text)
        except (APIError, BuildError) as exc:
            raise ImageBuildError(f"docker build failed: {exc}") from exc
        if image_id is None:
            raise ImageBuildError("docker build finished without reporting an image id")
        return image_id

    def _tag(self, image_id: str, recipe: str) -> None:
        repository, _, tag = self.image.rpartition(":")
        if not repository or "/" in tag:  # "name" or "registry:port/name": no explicit tag
            repository, tag = self.image, "latest"
        image = self.client.images.get(image_id)
        image.tag(repository, tag)
        image.tag(repository, recipe[:12])

