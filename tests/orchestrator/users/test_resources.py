"""Per-user CPU and memory: the maxima refuse, an override replaces the default field by field,
and the container spec of docker and kubernetes takes it."""

from __future__ import annotations

import pytest

from orchestrator.errors import InvalidInput
from orchestrator.sandboxes.docker_spec import Limits
from orchestrator.users.resources import Maxima, Resources, check_resources, effective_resources

MAXIMA = Maxima(cpus=2.0, memory_mb=2048)


def test_values_above_the_operators_maxima_are_refused_naming_the_field() -> None:
    check_resources(2.0, 2048, MAXIMA)
    check_resources(None, None, MAXIMA)
    with pytest.raises(InvalidInput) as cpus:
        check_resources(2.5, 10, MAXIMA)
    assert cpus.value.field == "cpus"
    with pytest.raises(InvalidInput) as memory:
        check_resources(1, 4096, MAXIMA)
    assert memory.value.field == "memory_mb"


def test_an_override_replaces_the_default_field_by_field() -> None:
    default = Resources(1.0, 1024)
    assert effective_resources(default, None, None) == default
    assert effective_resources(default, 1.5, None) == Resources(1.5, 1024)
    assert Limits(1.0, 1024, 512).for_user(None, 256) == Limits(1.0, 256, 512)
