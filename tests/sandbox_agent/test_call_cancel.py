"""The pure parts of leftover selection and call cancellation (the attacks that drive them run
in tests/orchestrator/sandboxes/test_call_containment.py)."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError

from orchestrator.errors import ToolError
from orchestrator.call_ledger import CallLedger, RoutedCall
from sandbox_agent.calls import CallCancelled, CallRegistry
from sandbox_agent.process_tree import Leader, ProcInfo, select_victims
from sandbox_agent.wire import CallContext, CancelRequest

ME, UID, OTHER_UID = 10, 1000, 0


def proc(pid: int, ppid: int, *, sid: int = 1, start: int = 100, uid: int = UID, running: bool = True) -> ProcInfo:
    return ProcInfo(pid, ppid, sid, start, uid, running)


def table(*procs: ProcInfo) -> dict[int, ProcInfo]:
    return {p.pid: p for p in procs}


BASE = (proc(1, 0, uid=OTHER_UID, start=0), proc(5, 1, start=1), proc(ME, 5, start=2))  # init, bwrap, the agent


def victims(procs: dict[int, ProcInfo], leader: Leader, **kw: object) -> set[int]:
    options: dict[str, object] = {"me": ME, "my_uid": UID, "others": [], "kept": [], "whole_uid": True}
    options.update({"has_marker": lambda pid: False, **kw})
    return select_victims(procs, leader, **options)  # type: ignore[arg-type]


def test_the_sweep_takes_every_process_of_the_uid_but_the_agent_its_ancestors_and_kept_ones() -> None:
    leader = Leader(20, 150, "m")
    procs = table(*BASE, proc(20, ME, sid=20, start=150), proc(21, 20, sid=20, start=151),
                  proc(30, ME, sid=30, start=120), proc(31, 1, sid=31, start=90),
                  proc(40, 1, uid=OTHER_UID), proc(50, 1, start=95), proc(51, 50, start=96),
                  proc(60, ME, start=99, running=False))  # fmt: skip
    assert victims(procs, leader, kept=[50]) == {20, 21, 30, 31}


def test_a_process_the_runtime_entered_during_the_call_is_not_a_leftover_but_its_children_are() -> None:
    # A pod's exec probe (or kubectl exec) has its parent outside the pid namespace: ppid 0.
    leader = Leader(20, 150, "m")
    procs = table(*BASE, proc(20, ME, sid=20, start=150), proc(90, 0, sid=90, start=151), proc(91, 90, sid=90, start=152))
    assert victims(procs, leader) == {20, 91}


def test_a_zombie_leader_with_a_live_thread_counts_as_running() -> None:
    leader = Leader(20, 150, "m")
    assert victims(table(*BASE, proc(20, ME, sid=20, start=150, running=True)), leader) == {20}


def test_while_another_call_runs_only_what_is_older_than_it_is_swept() -> None:
    leader, other = Leader(20, 150, "m"), Leader(70, 160, "o")
    procs = table(*BASE, proc(31, 1, sid=31, start=155), proc(32, 1, sid=32, start=165),
                  proc(70, ME, sid=70, start=160), proc(71, 70, sid=70, start=161),
                  proc(33, 1, sid=33, start=170))  # fmt: skip
    found = victims(procs, leader, others=[other], has_marker=lambda pid: pid == 33)
    assert found == {31, 33}  # older than the other call, or carrying this call's marker


def test_a_reused_leader_pid_is_not_the_call() -> None:
    leader = Leader(20, 150, "m")
    procs = table(*BASE, proc(20, 1, sid=99, start=400), proc(21, 20, sid=99, start=401))
    assert victims(procs, leader, others=[Leader(80, 300, "o")]) == set()


def test_with_a_shared_uid_only_the_agents_orphans_are_leftovers() -> None:
    leader = Leader(20, 150, "m")
    procs = table(*BASE, proc(30, ME, sid=30, start=120), proc(31, 1, sid=31, start=90))
    assert victims(procs, leader, whole_uid=False) == {30}


def test_cancel_kills_matching_trees_and_refuses_later_calls() -> None:
    killed: list[Leader] = []
    registry = CallRegistry(kill=killed.append)
    tree = Leader(20, 1, "m")
    mine = registry.begin(CallContext(run_id="r-1", session_id="s-1"))
    assert mine.attach(tree)
    other = registry.begin(CallContext(run_id="r-2", session_id="s-2"))
    threading.Timer(0.1, lambda: registry.end(mine)).start()
    assert registry.cancel(None, "s-1", wait_s=5) == 1
    assert killed == [tree] and mine.cancelled and not other.cancelled
    with pytest.raises(CallCancelled):
        registry.begin(CallContext(run_id="r-9", session_id="s-1"))
    late = registry.begin(CallContext(run_id="r-3", session_id="s-3"))
    registry.cancel("r-3", None, wait_s=0)
    assert not late.attach(Leader(30, 1, "n"))  # cancelled before its shell was attached: kill it at once


def test_cancel_needs_an_id() -> None:
    with pytest.raises(ValidationError):
        CancelRequest()
    assert CancelRequest(run_id="r-1").session_id is None


def test_the_router_refuses_calls_of_a_cancelled_run_or_session() -> None:
    calls = CallLedger()
    with calls.holding(RoutedCall(17, "r-1", "s-1")):
        assert calls.routed(17, "r-1", None) == 1 and calls.users_of(None, "s-1") == {17}
        calls.cancel("r-1", None)
    assert calls.routed(17, "r-1", "s-1") == 0
    with pytest.raises(ToolError) as refused:
        with calls.holding(RoutedCall(17, "r-1", "s-1")):
            pass
    assert refused.value.code == "cancelled"
    with calls.holding(RoutedCall(17, "r-2", "s-1")):
        pass


def test_the_pid_namespaces_init_is_never_a_victim_even_of_the_agents_uid() -> None:
    # A Kubernetes pod that shares its process namespace: the pause process is PID 1 and runs
    # as the pod's uid, the agent's parent is outside the namespace (ppid 0). A SIGKILL from
    # inside to PID 1 is ignored, so sweeping it spun through every round (10 s per shell call).
    leader = Leader(20, 150, "m")
    procs = table(proc(1, 0, start=0), proc(ME, 0, start=2), proc(20, ME, sid=20, start=150), proc(31, 1, sid=31, start=90))
    assert victims(procs, leader) == {20, 31}
