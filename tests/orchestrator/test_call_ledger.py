"""The call ledger on its own (no service, no sandbox): each claim is counted while held and
gone once released whichever way the block ends, refusals count nothing, and every question
the dispatcher, the idle-run sweeper, the router, the reaper and /metrics ask is answered."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.call_ledger import (
    CallLedger,
    RoutedCall,
    RunCall,
    SandboxCall,
    SandboxEntry,
    SandboxPaused,
    UserCall,
    on_sandbox,
)
from orchestrator.errors import ToolError


def test_a_user_over_the_cap_is_refused_busy_and_a_released_slot_lets_the_next_in() -> None:
    ledger = CallLedger(user_max_calls=2)
    first, second = ledger.take(UserCall(7)), ledger.take(UserCall(7))
    with pytest.raises(ToolError) as refused:
        ledger.take(UserCall(7))
    assert refused.value.code == "busy" and "ORCH_USER_MAX_CONCURRENT_CALLS=2" in refused.value.message
    assert ledger.user_calls(7) == 2  # the refusal counted nothing
    with ledger.holding(UserCall(8)):  # another user's calls are not this one's
        assert sorted(ledger.per_user()) == [(7, 2), (8, 1)]
    first.release()
    first.release()  # a second release gives nothing back twice
    assert ledger.user_calls(7) == 1
    with ledger.holding(UserCall(7)):
        assert ledger.user_calls(7) == 2
    second.release()
    assert ledger.per_user() == []


def test_a_hold_is_released_when_its_block_raises() -> None:
    ledger = CallLedger()
    with pytest.raises(RuntimeError):
        with ledger.holding(UserCall(3)), ledger.holding(RunCall("r-1")):
            raise RuntimeError("the call broke")
    assert ledger.per_user() == [] and ledger.run_calls("r-1") == 0


def test_a_run_with_a_call_under_way_is_not_ended_and_an_idle_one_is() -> None:
    ledger = CallLedger()
    ended: list[str] = []
    with ledger.holding(RunCall("r-1")):
        assert not ledger.end_if_idle("r-1", lambda: ended.append("r-1"))
        assert ledger.end_if_idle("r-2", lambda: ended.append("r-2"))  # another run is idle
    assert ledger.end_if_idle("r-1", lambda: ended.append("r-1"))
    assert ended == ["r-2", "r-1"]


def test_a_call_that_comes_while_its_run_is_being_ended_waits_for_the_end() -> None:
    ledger = CallLedger()
    ending, may_finish = threading.Event(), threading.Event()
    order: list[str] = []

    def end() -> None:
        ending.set()
        may_finish.wait(5)
        order.append("ended")

    sweeper = threading.Thread(target=ledger.end_if_idle, args=("r-1", end))
    sweeper.start()
    assert ending.wait(5)

    def call() -> None:
        with ledger.holding(RunCall("r-1")):
            order.append("called")

    caller = threading.Thread(target=call)
    caller.start()
    with ledger.holding(RunCall("r-2")):  # another run's call does not wait
        pass
    time.sleep(0.1)
    assert order == []  # still waiting for the end
    may_finish.set()
    sweeper.join(5)
    caller.join(5)
    assert order == ["ended", "called"]
    assert ledger.run_calls("r-1") == 0


def test_an_end_that_fails_lets_the_waiting_calls_go_on() -> None:
    ledger = CallLedger()

    def end() -> None:
        raise RuntimeError("the run was active again")

    with pytest.raises(RuntimeError):
        ledger.end_if_idle("r-1", end)
    with ledger.holding(RunCall("r-1")):  # does not wait for an end that is over
        assert ledger.run_calls("r-1") == 1


def test_routed_calls_answer_cancels_and_the_egress_proxy() -> None:
    ledger = CallLedger()
    with ledger.holding(RoutedCall(17, "r-1", "s-1")), ledger.holding(RoutedCall(18, None, "s-2")):
        assert ledger.routed(17, "r-1", None) == 1 and ledger.routed(17, "r-1", "s-1") == 2
        assert ledger.users_of("r-1", None) == {17} and ledger.users_of(None, "s-2") == {18}
        assert ledger.sessions_of(17) == {"s-1"} and ledger.sessions_of(19) == set()
        ledger.cancel(None, "s-1")
        with pytest.raises(ToolError) as refused:
            ledger.take(RoutedCall(18, "r-9", "s-1"))  # any call naming the cancelled session
        assert refused.value.code == "cancelled" and "session s-1" in refused.value.message
        assert ledger.routed(18, "r-9", "s-1") == 0  # refused: nothing counted
    assert ledger.routed(17, "r-1", "s-1") == 0 and ledger.users_of("r-1", "s-1") == set()
    with ledger.holding(RoutedCall(17)):  # a call outside any run is never cancelled
        pass


def test_a_sandbox_with_a_call_in_flight_is_not_paused_and_a_paused_one_refuses_calls() -> None:
    ledger = CallLedger()
    sandbox = SandboxEntry()
    with ledger.holding(SandboxCall(sandbox)):
        assert sandbox.in_flight == 1 and sandbox.busy
        assert not sandbox.pause_if_idle()
    before = sandbox.last_used
    assert sandbox.in_flight == 0 and not sandbox.busy
    assert sandbox.pause_if_idle() and sandbox.paused
    with pytest.raises(SandboxPaused):
        with on_sandbox(sandbox):  # the hold without a ledger at hand: the same count
            pass
    assert sandbox.in_flight == 0
    sandbox.unpause()
    assert sandbox.last_used >= before  # the pause clock restarts
    with on_sandbox(sandbox):
        assert sandbox.in_flight == 1


def test_many_threads_leave_every_count_at_zero() -> None:
    ledger = CallLedger(user_max_calls=1000)
    sandbox = SandboxEntry()

    def calls() -> None:
        for i in range(200):
            with ledger.holding(RunCall(f"r-{i % 3}")), ledger.holding(UserCall(i % 5)):
                with ledger.holding(RoutedCall(i % 5, f"r-{i % 3}", "s")), on_sandbox(sandbox):
                    pass

    threads = [threading.Thread(target=calls) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.per_user() == [] and sandbox.in_flight == 0
    assert all(ledger.run_calls(f"r-{i}") == 0 for i in range(3))
    assert ledger.users_of(None, "s") == set()
