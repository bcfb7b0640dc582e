"""PeriodicTask: runs on time, survives a failing round, stops promptly."""

from __future__ import annotations

import threading
import time

from orchestrator.periodic import PeriodicTask


def test_runs_repeatedly_survives_failures_and_stops() -> None:
    calls: list[float] = []
    enough = threading.Event()

    def work() -> None:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("one bad round")
        if len(calls) >= 4:
            enough.set()

    task = PeriodicTask("test", 0.02, work, first_delay_s=0)
    task.start()
    assert enough.wait(5)
    started = time.monotonic()
    task.stop()
    assert time.monotonic() - started < 1
    count = len(calls)
    time.sleep(0.1)
    assert len(calls) == count and task.runs >= 4
