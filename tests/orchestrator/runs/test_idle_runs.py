"""ORCH_RUN_MAX_IDLE_S: a run whose bot went away ends as failed, through RunService.end (so its
delivery settles and its session's inbox is free again); a run that keeps calling tools, or has
a call under way, keeps running."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

import pytest

from orchestrator import audit
from orchestrator.call_ledger import RunCall
from orchestrator.clock import iso, now_iso
from orchestrator.errors import Conflict
from orchestrator.runs.idle_runs import MAX_SWEEP_INTERVAL_S, MIN_SWEEP_INTERVAL_S, idle_cutoff, sweep_interval_s
from orchestrator.runs.records import RunStatus
from orchestrator.service import OrchestratorService
from tests.conftest import make_settings
from tests.orchestrator.collaboration.conftest import Harness

MAX_IDLE_S = 1.5  # short, with room for a loaded test machine


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def status(service: OrchestratorService, run_id: str) -> RunStatus:
    return service.runs.get(run_id).status


@pytest.fixture
def started(data_dir) -> Iterator[Harness]:
    """A started service (its periodic sweeper running) with a short idle limit."""
    service = OrchestratorService(make_settings(data_dir, run_max_idle_s=MAX_IDLE_S))
    service.start()
    try:
        yield Harness(service)
    finally:
        service.close()


def test_sweep_interval_and_cutoff() -> None:
    assert sweep_interval_s(4 * 3600) == MAX_SWEEP_INTERVAL_S
    assert sweep_interval_s(2.0) == 0.5
    assert sweep_interval_s(0.01) == MIN_SWEEP_INTERVAL_S
    now = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc)
    assert idle_cutoff(now, 0.5) == "2026-01-02T03:04:05.100000+00:00"
    assert idle_cutoff(now, 3600) < iso(now) < now_iso()  # stored timestamps compare as strings


def test_a_dead_bots_run_fails_and_frees_the_sessions_inbox(started: Harness) -> None:
    h = started
    h.session("A"), h.session("B")
    dead = h.user_run("B")  # its bot dies: no tool call, no end
    request_id = h.contact(h.user_run("A"), "B")
    assert h.claim("B") is None  # B is busy

    wait_for(lambda: status(h.service, dead) is RunStatus.FAILED)
    (entry,) = [e for e in audit.entries(h.service.store, action="run.end") if e.detail["run_id"] == dead]
    assert (entry.actor, entry.detail["status"], entry.detail["reason"]) == ("sweeper", "failed", "idle")
    assert entry.session_id == "B"
    item = h.claim("B")  # the end listener woke the inbox: the delivery is handed out now
    assert item is not None and item.delivery.request_id == request_id


def test_a_dead_delivery_run_settles_its_delivery(started: Harness) -> None:
    h = started
    h.session("A"), h.session("B")
    request_id = h.contact(h.user_run("A"), "B")
    _, target_run = h.take("B")  # then the target's bot dies
    assert h.states("A", request_id)[:2] == ("processing", "linked")

    # The end listener settles the delivery just after the run's end commits.
    wait_for(lambda: h.view("A", request_id).request.state.value == "failed")
    assert status(h.service, target_run) is RunStatus.FAILED
    view = h.view("A", request_id)
    assert (view.request.state.value, view.request.reason) == ("failed", "no_result")
    assert view.delivery_state is not None and view.delivery_state.value == "settled"


def test_tool_calls_keep_a_run_alive(started: Harness) -> None:
    h = started
    h.session("A")
    run = h.user_run("A")
    until = time.monotonic() + 2 * MAX_IDLE_S
    while time.monotonic() < until:
        assert h.tool(run, "session_search", {"query": "anything"})["ok"]
        time.sleep(0.1)
    assert status(h.service, run) is RunStatus.RUNNING
    wait_for(lambda: status(h.service, run) is RunStatus.FAILED)  # once the calls stop


def test_a_call_under_way_is_not_idle_and_a_call_in_between_keeps_the_run(service: OrchestratorService) -> None:
    h = Harness(service)
    h.session("A")
    run = h.user_run("A")
    time.sleep(0.05)
    sweeper = service.idle_runs
    sweeper.max_idle_s = 0.01
    with service.call_ledger.holding(RunCall(run)):  # what the dispatcher holds around a call
        assert sweeper.sweep() == []
    assert status(service, run) is RunStatus.RUNNING
    # Listed as idle, then a call lands before the end commits: the end refuses.
    listed_at = now_iso()
    assert h.tool(run, "session_search", {"query": "anything"})["ok"]
    with pytest.raises(Conflict, match="active again"):
        service.runs.end(run, RunStatus.FAILED, actor="sweeper", idle_before=listed_at)
    time.sleep(0.05)
    assert sweeper.sweep() == [run]
    assert status(service, run) is RunStatus.FAILED
    assert sweeper.sweep() == []

