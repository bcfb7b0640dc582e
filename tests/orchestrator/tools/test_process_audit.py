"""The audit rows of background-process calls are decided from what the sandbox answered,
which it may forge: only ids of the agent's form and int exit codes are taken."""

from __future__ import annotations

from orchestrator.tools.process_audit import process_events

PID = "p-" + "a" * 24


def test_start_signal_and_a_first_seen_exit_are_audited() -> None:
    start = process_events("process_start", {"command": "make", "pty": False}, {"process_id": PID, "pid": 12})
    assert [(e.action, e.detail["process_id"], e.detail["command"]) for e in start] == [("process.start", PID, "make")]
    signal = process_events("process_signal", {"signal": "KILL"}, {"process_id": PID, "delivered": True, "exit_new": True, "exit_code": 137, "end_reason": "signal"})
    assert [e.action for e in signal] == ["process.signal", "process.exit"]
    listed = process_events("process_list", {}, {"processes": [{"process_id": PID, "exit_new": True, "exit_code": 0, "end_reason": "exited"}, {"process_id": PID}]})
    assert [(e.action, e.detail["exit_code"]) for e in listed] == [("process.exit", 0)]
    assert process_events("process_output", {}, {"process_id": PID, "running": True}) == []


def test_forged_answers_add_nothing_untrusted() -> None:
    assert process_events("process_start", {"command": "x"}, {"process_id": "../../etc"}) == []
    assert process_events("process_list", {}, {"processes": "many"}) == []
    forged = process_events("process_output", {}, {"process_id": PID, "exit_new": True, "exit_code": "rm -rf", "end_reason": "<script>"})
    assert forged[0].detail == {"process_id": PID, "exit_code": None, "end_reason": None}
    assert process_events("shell", {}, {"process_id": PID, "exit_new": True}) == []
    assert process_events("process_output", {}, ["not", "a", "dict"]) == []


def test_a_forged_list_cannot_flood_the_audit() -> None:
    # A lying agent answers process_list with as many "newly ended" processes as the answer
    # bound (11 MiB) holds, the same id over and over and ids that never existed: every call
    # would add ~200,000 rows in the caller's one write transaction. At most the agent's own
    # table of ended processes (ENDED_KEPT) is recorded, each id once.
    from sandbox_agent.processes import ENDED_KEPT

    same = [{"process_id": PID, "exit_new": True, "exit_code": 0, "end_reason": "exited"}] * 100_000
    many = [{"process_id": f"p-{i:024x}", "exit_new": True, "exit_code": 0} for i in range(100_000)]
    assert len(process_events("process_list", {}, {"processes": same})) == 1
    assert len(process_events("process_list", {}, {"processes": many})) == ENDED_KEPT
    real = [{"process_id": f"p-{i:024x}", "exit_new": True, "exit_code": 0} for i in range(ENDED_KEPT)]
    assert len(process_events("process_list", {}, {"processes": real})) == ENDED_KEPT
