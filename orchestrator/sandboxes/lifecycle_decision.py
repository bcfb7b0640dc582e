"""The one decision of the sandbox lifecycle: what to do with a user's sandbox, given what the
platform shows of it (observed) and what the user's call wants (the current plan, image and
agent BUILD). Pure: the engine (`lifecycle_engine.py`) acts on the answer through a driver's
verbs, and every backend is decided by this same table (docs/lifecycle.md, "The decision
table").

    observed          fit            busy   action
    ----------------  -------------  -----  -------------------------------------------
    absent            (any)          (any)  create
    ended             (any)          (any)  recreate      crashed, killed, evicted, deleting
    stopped           outdated       (any)  recreate      cleanly stopped, but outdated
    stopped           current/drift  (any)  start         our own idle stop: start it again
    starting          current        (any)  wait          on its way (a pending pod)
    starting          outdated/drift (any)  recreate
    running           current        (any)  use
    running           outdated       yes    use           the calls under way finish first
    running           outdated       no     recreate
    running           drift          yes    use
    running           drift          no     restart agent (in place when the driver can,
                                                           else recreate)

`busy` is a call in flight or a background process of the sandbox's, unless the sandbox
carries a group the plan no longer gives (`loses_group_access`): that one never waits.
"""

from __future__ import annotations

from enum import Enum


class Observed(str, Enum):
    """What the platform shows of the user's sandbox."""

    ABSENT = "absent"  # none exists
    ENDED = "ended"  # crashed, killed, failed, evicted, being deleted, or its agent does not answer
    STOPPED = "stopped"  # stopped cleanly (our own idle stop): it can start again as it is
    STARTING = "starting"  # on its way (a pending pod)
    RUNNING = "running"


class Fit(str, Enum):
    """How the sandbox fits what the call wants."""

    CURRENT = "current"
    OUTDATED = "outdated"  # another plan, image, runtime or limits: only a new sandbox fits
    DRIFT = "drift"  # only the agent's BUILD moved on: a restart of the agent fits


class LifecycleAction(str, Enum):
    USE = "use"  # running and current (or busy): call it
    CREATE = "create"  # none exists
    START = "start"  # cleanly stopped and still current: start the same sandbox
    RECREATE = "recreate"  # remove it and create a new one
    RESTART_AGENT = "restart_agent"  # same sandbox, same mounts: the agent restarts with the new BUILD
    WAIT = "wait"  # current and on its way: wait for its agent


def fit_of(*, outdated: bool, running_build: str | None, wanted_build: str) -> Fit:
    """Pure: outdated wins over drift; a BUILD not known yet (None) is no drift."""
    if outdated:
        return Fit.OUTDATED
    if running_build is not None and running_build != wanted_build:
        return Fit.DRIFT
    return Fit.CURRENT


def decide(observed: Observed, fit: Fit, *, busy: bool, restarts_in_place: bool = True) -> LifecycleAction:
    """The table above. `restarts_in_place`: the driver can restart the agent in the same
    sandbox (a docker container can; a pod cannot, it is created again)."""
    if observed is Observed.ABSENT:
        return LifecycleAction.CREATE
    if observed is Observed.ENDED:
        return LifecycleAction.RECREATE
    if observed is Observed.STOPPED:
        return LifecycleAction.RECREATE if fit is Fit.OUTDATED else LifecycleAction.START
    if observed is Observed.STARTING:
        return LifecycleAction.WAIT if fit is Fit.CURRENT else LifecycleAction.RECREATE
    if fit is Fit.CURRENT or busy:
        return LifecycleAction.USE
    if fit is Fit.DRIFT and restarts_in_place:
        return LifecycleAction.RESTART_AGENT
    return LifecycleAction.RECREATE
