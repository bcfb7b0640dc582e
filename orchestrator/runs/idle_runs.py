"""Ending runs whose bot went away (docs/decisions.md, "Runs that never end").

A bot that dies mid-run never ends its run, and a `running` run keeps its session busy: the
session's collaboration inbox hands nothing out. The sweeper ends a run as `failed` once it has
gone `ORCH_RUN_MAX_IDLE_S` without a tool call (counted from its start when it made none),
through `RunService.end`, so end listeners settle its delivery and wake the inbox like after
any other end; the audit row says actor `sweeper`, reason `idle`.

Activity costs no write of its own: the dispatcher notes a call's time in the transaction that
audits it (`RunRepository.touch_in`). A call still under way is not idle however long it takes;
the call ledger (`orchestrator/call_ledger.py`, `RunCall`) knows those, in memory, and makes
"not busy, so end it" one step: a call either registers before the sweeper looks (the run is
kept) or after the run ended (and is refused like any call on an ended run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from orchestrator.call_ledger import CallLedger
from orchestrator.clock import iso
from orchestrator.errors import Conflict, NotFound
from orchestrator.log import kv
from orchestrator.runs.records import RunRepository, RunStatus
from orchestrator.runs.service import RunService

log = logging.getLogger(__name__)

ACTOR = "sweeper"
# Sweep a few times per allowed idle time, so a run ends at most ~25 % late; never more rarely
# than every 5 minutes, never more often than 20 times a second.
SWEEPS_PER_IDLE = 4
MAX_SWEEP_INTERVAL_S = 300.0
MIN_SWEEP_INTERVAL_S = 0.05


def sweep_interval_s(max_idle_s: float) -> float:
    return min(max(max_idle_s / SWEEPS_PER_IDLE, MIN_SWEEP_INTERVAL_S), MAX_SWEEP_INTERVAL_S)


def idle_cutoff(now: datetime, max_idle_s: float) -> str:
    """The stored timestamp before which a run's last activity makes it idle for too long."""
    return iso(now - timedelta(seconds=max_idle_s))


class IdleRunSweeper:
    def __init__(
        self,
        *,
        repo: RunRepository,
        runs: RunService,
        ledger: CallLedger,
        max_idle_s: float,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self._repo = repo
        self._runs = runs
        self._ledger = ledger
        self.max_idle_s = max_idle_s
        self._clock = clock

    def sweep(self) -> list[str]:
        """End the runs idle for longer than allowed as failed; their ids."""
        cutoff = idle_cutoff(self._clock(), self.max_idle_s)
        ended: list[str] = []
        for run_id in self._repo.idle_since(cutoff):

            def end(run_id: str = run_id) -> None:
                self._runs.end(run_id, RunStatus.FAILED, actor=ACTOR, reason="idle", idle_before=cutoff)

            try:
                if self._ledger.end_if_idle(run_id, end):
                    ended.append(run_id)
            except (Conflict, NotFound):
                pass  # ended, active again, or gone (session purged) since it was listed
        if ended:
            log.warning(
                "ended runs without a tool call for too long as failed %s",
                kv(runs=",".join(ended), max_idle_s=self.max_idle_s),
            )
        return ended
