"""The pure parts of the uid freeze (the attacks that drive it, a fork-hopper through the public
API, run in tests/orchestrator/sandboxes/test_call_containment.py and its docker twin)."""

from __future__ import annotations

from sandbox_agent.uid_freeze import deepest_first, stopping

RUNNING = b"Name:\tsleep\nState:\tS (sleeping)\nPPid:\t1\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n"


def test_a_stopped_process_or_one_with_a_sigstop_pending_counts_as_stopped() -> None:
    assert not stopping(RUNNING)
    assert stopping(RUNNING.replace(b"S (sleeping)", b"T (stopped)"))
    assert stopping(RUNNING.replace(b"ShdPnd:\t0000000000000000", b"ShdPnd:\t0000000000040000"))  # SIGSTOP: bit 18
    assert stopping(RUNNING.replace(b"SigPnd:\t0000000000000000", b"SigPnd:\t0000000000040000"))
    assert not stopping(RUNNING.replace(b"ShdPnd:\t0000000000000000", b"ShdPnd:\t0000000000080000"))  # SIGTSTP


def test_children_are_continued_before_their_parents_and_unknown_pids_first() -> None:
    parents = {5: 1, 10: 5, 20: 10, 21: 20, 30: 10}  # 5 -> 10 -> {20 -> 21, 30}
    order = deepest_first([5, 10, 20, 21, 30, 99], parents)
    assert order[0] == 99  # forked after the census: a child of something, never a parent of it
    assert order.index(21) < order.index(20) < order.index(10) < order.index(5)
    assert order.index(30) < order.index(10)
    assert deepest_first([7, 8], {7: 8, 8: 7}) in ([7, 8], [8, 7])  # a loop (pids reused) ends
