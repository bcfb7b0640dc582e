"""What noting a run's last activity costs a tool call, side by side with not noting it.

The dispatcher writes each call's audit row in one write transaction; the idle-run sweeper
needs the run's last activity, which the dispatcher sets in that same transaction
(`RunRepository.touch_in`). Measured on a real state store (WAL, synchronous=NORMAL) with
10,000 ended runs and one running run: the audit transaction alone, and with the touch,
interleaved in rounds; then one sweep query over those runs. Since the audit row is written
before a call runs, the dispatcher writes twice: the row (`started`) in the transaction that
reads the run, then its outcome with the touch; `audit_before_and_after` is that pair.

Run: .venv/bin/python bench/run_activity.py   (prints `name: value unit` lines)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator import audit  # noqa: E402
from orchestrator.clock import now_iso  # noqa: E402
from orchestrator.runs.records import RunRepository  # noqa: E402
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore  # noqa: E402

ENDED_RUNS, CALLS, ROUNDS = 10_000, 500, 7


def fill(store: StateStore) -> None:
    at = now_iso()
    with store.write() as tx:
        for n in range(ENDED_RUNS + 1):
            status = "running" if n == ENDED_RUNS else "succeeded"
            tx.execute(
                "INSERT INTO runs (run_id, session_id, trigger, agent_id, identity_mode, owner_user_id,"
                " runtime_user_id, status, started_at) VALUES (?, 's', 'web', 'default', 'owner', 1, 1, ?, ?)",
                (f"r-{n}", status, at),
            )


def calls(store: StateStore, touch: bool) -> float:
    """Microseconds per audited call."""
    started = time.perf_counter()
    for _ in range(CALLS):
        with store.write() as tx:
            audit.record(tx, actor="bench", action="tool.call", session_id="s", run_id="r-live", tool="read_file")
            if touch:
                RunRepository.touch_in(tx, f"r-{ENDED_RUNS}", now_iso())
    return (time.perf_counter() - started) / CALLS * 1e6


def calls_audited_before(store: StateStore) -> float:
    """Microseconds per call audited as the dispatcher does now: row first, outcome after."""
    started = time.perf_counter()
    for _ in range(CALLS):
        with store.write() as tx:
            RunRepository.get_in(tx, f"r-{ENDED_RUNS}")
            entry = audit.record(
                tx, actor="bench", action="tool.call", session_id="s", run_id="r-live", tool="read_file", outcome="started"
            )
        with store.write() as tx:
            audit.complete(tx, entry, run_id="r-live", tool="read_file", outcome="ok", duration_ms=1.0)
            RunRepository.touch_in(tx, f"r-{ENDED_RUNS}", now_iso())
    return (time.perf_counter() - started) / CALLS * 1e6


def read_then_touch(store: StateStore) -> float:
    """The same before the change: the run read in a read snapshot, one audited write."""
    started = time.perf_counter()
    for _ in range(CALLS):
        with store.read() as tx:
            RunRepository.get_in(tx, f"r-{ENDED_RUNS}")
        with store.write() as tx:
            audit.record(tx, actor="bench", action="tool.call", session_id="s", run_id="r-live", tool="read_file")
            RunRepository.touch_in(tx, f"r-{ENDED_RUNS}", now_iso())
    return (time.perf_counter() - started) / CALLS * 1e6


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp) / "state" / "orchestrator.sqlite3", STATE_MIGRATIONS)
        store.open()
        fill(store)
        plain, touched, after_read, before_after = [], [], [], []
        for _ in range(ROUNDS):
            plain.append(calls(store, touch=False))
            touched.append(calls(store, touch=True))
            after_read.append(read_then_touch(store))
            before_after.append(calls_audited_before(store))
        repo = RunRepository(store)
        sweeps = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            repo.idle_since(now_iso())
            sweeps.append((time.perf_counter() - started) * 1e6)
        store.close()
    p, t = statistics.median(plain), statistics.median(touched)
    print(f"audit_tx_only: {p:.1f} us")
    print(f"audit_tx_with_touch: {t:.1f} us")
    print(f"touch_extra: {t - p:.1f} us")
    print(f"touch_ratio: {t / p:.2f} x")
    r, b = statistics.median(after_read), statistics.median(before_after)
    print(f"read_then_audit_after: {r:.1f} us")
    print(f"audit_before_and_after: {b:.1f} us")
    print(f"audit_before_extra: {b - r:.1f} us")
    print(f"sweep_query_{ENDED_RUNS}_ended_runs: {statistics.median(sweeps):.1f} us")


if __name__ == "__main__":
    main()
