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

from collections.abc import Iterable
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


def loses_group_access(running_gids: Iterable[int], planned_gids: Iterable[int]) -> bool:
    """Pure: whether the sandbox now running carries a group gid (and so a workspace) the plan
    no longer gives it: a revoked membership. Such a sandbox is replaced before the next call
    even while it is busy; other plan changes wait until it is idle."""
    return not set(running_gids) <= set(planned_gids)


def reap_interval_s(idle_timeout_s: float, pause_after_s: float = 0.0) -> float:
    """How often a backend's idle sandboxes are looked for: a quarter of the shorter of the
    idle timeout and the pause time (when pausing is on), so one is paused or stopped at most
    a quarter late, within [0.05, 5] s."""
    shortest = pause_after_s if 0 < pause_after_s < idle_timeout_s else idle_timeout_s
    return min(max(shortest / 4, 0.05), 5.0)


class IdleAction(Enum):
    NOTHING = "nothing"
    PAUSE = "pause"
    STOP = "stop"


def idle_action(
    *,
    idle_s: float,
    in_flight: int,
    paused: bool,
    has_running_processes: bool,
    pause_after_s: float,
    idle_timeout_s: float,
) -> IdleAction:
    """Pure: what the reaper does with one sandbox. A call in flight or a process of the
    agent's still running (`runs_processes`, docs/processes.md) is activity: nothing.
    Idle for the idle timeout: stop (a paused one too). Idle for the pause time: pause, unless
    pausing is off (0) or would not come before the stop. The one decision every backend's reaper uses (`lifecycle_engine.reap_idle`)."""
    if in_flight > 0 or has_running_processes:
        return IdleAction.NOTHING
    if idle_s >= idle_timeout_s:
        return IdleAction.STOP
    if not paused and 0 < pause_after_s < idle_timeout_s and idle_s >= pause_after_s:
        return IdleAction.PAUSE
    return IdleAction.NOTHING
