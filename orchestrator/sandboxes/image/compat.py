"""Whether a sandbox image fits this orchestrator.

The agent's code is mounted from the host, but its dependencies come from the image. An image
built from another checkout (older, newer, or a branch that changed the agent's runtime) then
starts agents that die on import. So `build-image` labels the image with a digest of the
agent's pinned dependencies, and the orchestrator compares it with the digest of what it has
installed before it uses the image.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping

from orchestrator.sandboxes.image.checkout import BuildSources, ImageBuildError, agent_pins
from orchestrator.sandboxes.image.recipe import LABEL_AGENT_LOCK, agent_lock_digest


class ImageFit(enum.Enum):
    ABSENT = "absent"
    STALE = "stale"  # built for other agent dependencies (or before images carried the label)
    FITS = "fits"


def image_fit(labels: Mapping[str, str] | None, expected_lock: str | None) -> ImageFit:
    """Pure. `labels` is None when the image is absent; `expected_lock` is None when this
    installation cannot tell (not a source checkout), and then any present image fits."""
    if labels is None:
        return ImageFit.ABSENT
    if expected_lock is None or labels.get(LABEL_AGENT_LOCK) == expected_lock:
        return ImageFit.FITS
    return ImageFit.STALE


def stale_image_message(image: str) -> str:
    return (
        f"the sandbox image {image} was built for other agent dependencies than this "
        "orchestrator's (another checkout or version); an operator must run `orchestrator build-image`"
    )


@functools.lru_cache(maxsize=1)
def expected_agent_lock() -> str | None:
    """The digest the image must carry, from this source checkout; None without one. Computed
    once per process (reading every installed distribution's metadata takes tens of ms): the
    backend choice and the docker backend both ask, and installing packages needs a restart."""
    try:
        sources = BuildSources.from_checkout()
    except ImageBuildError:
        return None
    return agent_lock_digest(agent_pins(sources))
