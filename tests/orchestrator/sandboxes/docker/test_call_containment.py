"""Issue 12 items 3 and 13, and the fork-hopper findings, with containers: nothing a call
started outlives it (a hopper neither), its zombies are reaped, and deleting a session stops
its calls (the scenarios of `tests/orchestrator/sandboxes/test_call_containment.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.orchestrator.sandboxes.docker.conftest import docker_settings
from tests.orchestrator.sandboxes.test_call_containment import (
    UID_BASE,
    Served,
    a_call_ending_spares_a_concurrent_call,
    a_hopper_dies_and_a_background_process_lives,
    a_hopper_does_not_outlive_its_call,
    a_suspended_process_stays_suspended,
    an_interactive_job_is_not_stopped_by_the_sweeps,
    deleting_the_session_stops_its_calls,
    ending_the_run_stops_its_calls,
    escape_leaves_nothing,
    serving,
    zombies_do_not_pile_up,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def contained(docker_data_dir: Path, sandbox_image: str) -> Iterator[Served]:
    # Uids of their own, so the host-side count by uid meets no other test run's processes.
    with serving(docker_settings(docker_data_dir, sandbox_image, sandbox_uid_base=UID_BASE)) as served:
        yield served


@pytest.mark.parametrize("escape", ["zombie_leader_in_its_own_session_without_env", "double_fork_without_env"])
def test_item3_processes_do_not_outlive_their_call_in_a_container(
    contained: Served, escape: str
) -> None:
    escape_leaves_nothing(*contained, escape)


def test_item3_the_sweep_after_a_call_spares_a_concurrent_call_in_a_container(
    contained: Served,
) -> None:
    a_call_ending_spares_a_concurrent_call(*contained)


def test_item13_deleting_a_session_kills_its_calls_in_a_container(
    contained: Served,
) -> None:
    deleting_the_session_stops_its_calls(*contained)


def test_item13_ending_a_run_kills_its_calls_in_a_container(contained: Served) -> None:
    ending_the_run_stops_its_calls(*contained)


def test_finding1_a_fork_hopper_does_not_outlive_its_call_in_a_container(contained: Served) -> None:
    a_hopper_does_not_outlive_its_call(*contained)


def test_finding1_a_fork_hopper_dies_and_a_background_process_lives_in_a_container(contained: Served) -> None:
    a_hopper_dies_and_a_background_process_lives(*contained)


def test_finding14_the_zombies_of_a_hopper_are_reaped_in_a_container(contained: Served) -> None:
    zombies_do_not_pile_up(*contained)


def test_finding1_the_sweep_leaves_a_suspended_background_process_suspended_in_a_container(
    contained: Served,
) -> None:
    a_suspended_process_stays_suspended(*contained)


def test_finding1_the_sweep_does_not_stop_an_interactive_job_in_a_container(contained: Served) -> None:
    an_interactive_job_is_not_stopped_by_the_sweeps(*contained)
