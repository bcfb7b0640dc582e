"""The leftover sweep after one call never takes a concurrent call's shell (issue 14 item 15).

The sweep decides from a snapshot of the calls in flight and a scan of /proc. A call that
starts between the two was once taken for a leftover of the ending call and SIGKILLed. The
test starts a real second call exactly in that window (by running it just before the real
scan) and checks it survives and keeps its output. It runs in the test process, which is
then the "agent": the sweep takes only its own children there (no whole-uid sweep as root).
"""

from __future__ import annotations

import subprocess

import pytest

from sandbox_agent import process_tree


def _start(command: str) -> tuple[subprocess.Popen[bytes], process_tree.Leader]:
    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(["/bin/sh", "-c", command], stdout=subprocess.PIPE, start_new_session=True)

    return process_tree.spawn(start, "m" * 24)


def test_item15_a_call_starting_during_a_sweep_is_not_taken_for_a_leftover(monkeypatch: pytest.MonkeyPatch) -> None:
    real_scan = process_tree.scan
    started: list[tuple[subprocess.Popen[bytes], process_tree.Leader]] = []

    def scan_after_a_new_call_started() -> dict[int, process_tree.ProcInfo]:
        if not started:  # the first round of the first call's sweep: call B starts right now
            started.append(_start("sleep 0.3; echo b-output"))
        return real_scan()

    first, first_leader = _start("true")
    first.wait()
    monkeypatch.setattr(process_tree, "scan", scan_after_a_new_call_started)
    try:
        process_tree.kill_call(first_leader)
    finally:
        process_tree.unregister(first_leader)
        monkeypatch.setattr(process_tree, "scan", real_scan)
    second, second_leader = started[0]
    try:
        out, _ = second.communicate(timeout=10)
        assert second.returncode == 0, f"the concurrent call was killed (returncode {second.returncode})"
        assert out == b"b-output\n"
    finally:
        process_tree.unregister(second_leader)
