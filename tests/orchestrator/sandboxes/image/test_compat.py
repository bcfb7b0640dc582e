"""Whether a sandbox image fits: its agent-lock label against this checkout's pinned agent
dependencies (pure parts; the labels of a real image are checked in test_build.py)."""

from __future__ import annotations

from orchestrator.sandboxes.image.checkout import BuildSources, agent_pins
from orchestrator.sandboxes.image.compat import ImageFit, expected_agent_lock, image_fit
from orchestrator.sandboxes.image.recipe import LABEL_AGENT_LOCK, Pin, agent_lock_digest

PINS = (Pin("pydantic", "2.9.2"), Pin("starlette", "0.41.3"))


def test_the_digest_follows_every_pin_and_not_their_order() -> None:
    assert agent_lock_digest(PINS) == agent_lock_digest(tuple(reversed(PINS)))
    assert agent_lock_digest(PINS) != agent_lock_digest((Pin("pydantic", "2.9.2"), Pin("starlette", "0.42.0")))
    assert agent_lock_digest(PINS) != agent_lock_digest((*PINS, Pin("fastapi", "0.115.0")))


def test_an_image_fits_only_with_the_expected_label() -> None:
    lock = agent_lock_digest(PINS)
    assert image_fit(None, lock) is ImageFit.ABSENT
    assert image_fit({LABEL_AGENT_LOCK: lock, "other": "x"}, lock) is ImageFit.FITS
    assert image_fit({LABEL_AGENT_LOCK: "0" * 64}, lock) is ImageFit.STALE
    # built before images carried the label: cannot be trusted
    assert image_fit({}, lock) is ImageFit.STALE
    # an installation that cannot tell (no source checkout) trusts any present image
    assert image_fit({}, None) is ImageFit.FITS and image_fit(None, None) is ImageFit.ABSENT


def test_this_checkout_expects_the_digest_of_its_installed_agent_dependencies() -> None:
    pins = agent_pins(BuildSources.from_checkout())
    assert {pin.name for pin in pins} >= {"starlette", "uvicorn", "pydantic", "psutil", "regex"}
    assert expected_agent_lock() == agent_lock_digest(pins)
