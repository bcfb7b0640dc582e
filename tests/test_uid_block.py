"""The test run's uid span: free of every live instance's block and every other run's span."""

from __future__ import annotations

from tests.uid_block import FIRST_BASE, SPAN, free_base


def test_the_first_span_when_nothing_is_taken() -> None:
    assert free_base([]) == FIRST_BASE


def test_a_live_default_orchestrator_pushes_the_span_above_its_block() -> None:
    default_block = (100_000, 1_000_100_000)  # a `make run` on the default settings
    base = free_base([default_block])
    assert base is not None and base > default_block[1]
    assert (base - FIRST_BASE) % SPAN == 0


def test_other_runs_spans_are_skipped_and_a_full_host_has_none() -> None:
    first = free_base([])
    assert first is not None
    second = free_base([(first, first + SPAN - 1)])
    assert second == first + SPAN
    assert free_base([(0, 2_100_000_000)]) is None
