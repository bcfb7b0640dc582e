"""The lifecycle's one decision table (orchestrator/sandboxes/lifecycle_decision.py), row by row,
without any platform."""

from __future__ import annotations

import pytest

from orchestrator.sandboxes.lifecycle_decision import Fit, LifecycleAction, Observed, decide, fit_of

A = LifecycleAction

# observed, fit, busy, restarts in place -> action: every combination, written out.
TABLE = [
    *[(Observed.ABSENT, fit, busy, inplace, A.CREATE) for fit in Fit for busy in (False, True) for inplace in (False, True)],
    *[(Observed.ENDED, fit, busy, inplace, A.RECREATE) for fit in Fit for busy in (False, True) for inplace in (False, True)],
    *[(Observed.STOPPED, Fit.OUTDATED, busy, inplace, A.RECREATE) for busy in (False, True) for inplace in (False, True)],
    *[(Observed.STOPPED, Fit.CURRENT, busy, inplace, A.START) for busy in (False, True) for inplace in (False, True)],
    # our own stop: the agent code is mounted read-only, so the start runs the new BUILD
    *[(Observed.STOPPED, Fit.DRIFT, busy, inplace, A.START) for busy in (False, True) for inplace in (False, True)],
    *[(Observed.STARTING, Fit.CURRENT, busy, inplace, A.WAIT) for busy in (False, True) for inplace in (False, True)],
    *[(Observed.STARTING, Fit.OUTDATED, busy, inplace, A.RECREATE) for busy in (False, True) for inplace in (False, True)],
    *[(Observed.STARTING, Fit.DRIFT, busy, inplace, A.RECREATE) for busy in (False, True) for inplace in (False, True)],
    *[(Observed.RUNNING, Fit.CURRENT, busy, inplace, A.USE) for busy in (False, True) for inplace in (False, True)],
    (Observed.RUNNING, Fit.OUTDATED, True, True, A.USE),
    (Observed.RUNNING, Fit.OUTDATED, True, False, A.USE),
    (Observed.RUNNING, Fit.OUTDATED, False, True, A.RECREATE),
    (Observed.RUNNING, Fit.OUTDATED, False, False, A.RECREATE),
    (Observed.RUNNING, Fit.DRIFT, True, True, A.USE),
    (Observed.RUNNING, Fit.DRIFT, True, False, A.USE),
    (Observed.RUNNING, Fit.DRIFT, False, True, A.RESTART_AGENT),
    (Observed.RUNNING, Fit.DRIFT, False, False, A.RECREATE),
]


def test_the_table_covers_every_combination_once() -> None:
    keys = [(observed, fit, busy, inplace) for observed, fit, busy, inplace, _ in TABLE]
    assert len(keys) == len(set(keys)) == len(Observed) * len(Fit) * 2 * 2


@pytest.mark.parametrize(("observed", "fit", "busy", "restarts_in_place", "action"), TABLE)
def test_decide(observed: Observed, fit: Fit, busy: bool, restarts_in_place: bool, action: LifecycleAction) -> None:
    assert decide(observed, fit, busy=busy, restarts_in_place=restarts_in_place) is action


@pytest.mark.parametrize(
    ("outdated", "running_build", "fit"),
    [
        (False, "b1", Fit.CURRENT),
        (False, None, Fit.CURRENT),  # not known yet: no drift
        (False, "b0", Fit.DRIFT),
        (True, "b1", Fit.OUTDATED),
        (True, "b0", Fit.OUTDATED),  # outdated wins: only a new sandbox fits
        (True, None, Fit.OUTDATED),
    ],
)
def test_fit_of(outdated: bool, running_build: str | None, fit: Fit) -> None:
    assert fit_of(outdated=outdated, running_build=running_build, wanted_build="b1") is fit
