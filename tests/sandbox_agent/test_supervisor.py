"""The sandbox supervisor's deciders (the lease, the output budget, exit codes), and the
supervisor itself run as a plain process here: it ends its agent once the lease has expired,
passes the agent's output on within its budget, and exits with the agent's status.

Its PID 1 properties (no signal from inside the namespace, not traceable) are exercised in a
real container by tests/orchestrator/sandboxes/docker/test_dead_man_lease.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandbox_agent.supervisor import (
    Lease,
    OutputBudget,
    dead_man_check_s,
    exit_code,
    lease_expired,
    lease_text,
    parse_lease,
    read_lease,
)


def test_a_lease_round_trips_and_anything_else_counts_as_expired() -> None:
    lease = parse_lease(lease_text(1000.0, 2.0).encode())
    assert lease == Lease(1000.0, 2.0)
    assert not lease_expired(lease, 999.9) and lease_expired(lease, 1000.0)
    for raw in (b"", b"{", b'{"expires_at": "x", "check_s": 1}', b'{"expires_at": 1e400, "check_s": 1}',
                b'{"expires_at": 5, "check_s": 0}', b"\xff", b'{"check_s": 1}'):  # fmt: skip
        assert parse_lease(raw) is None, raw
    assert lease_expired(None, 0.0)
    assert parse_lease(lease_text(1.0, 1e9).encode()).check_s == 10.0  # type: ignore[union-attr]
    assert dead_man_check_s(2.0) == 0.2 and dead_man_check_s(960.0) == 10.0


def test_the_lease_file_is_read_without_following_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text(lease_text(time.time() + 60, 1.0))
    assert read_lease(str(real)) is not None
    (tmp_path / "link").symlink_to(real)
    assert read_lease(str(tmp_path / "link")) is None
    assert read_lease(str(tmp_path / "missing")) is None
    assert read_lease(str(tmp_path)) is None  # a directory


def test_the_output_budget_is_a_burst_then_a_trickle() -> None:
    budget = OutputBudget(burst=100, per_s=10, now=0.0)
    assert budget.take(150, 0.0) == 100
    assert budget.take(50, 0.0) == 0
    assert budget.take(50, 2.0) == 20
    assert budget.take(1000, 1000.0) == 100  # never more than the burst


def test_exit_codes_follow_the_shell() -> None:
    assert exit_code(0) == 0 and exit_code(3 << 8) == 3
    assert exit_code(signal.SIGKILL) == 137 and exit_code(signal.SIGTERM) == 143


def supervise(lease: Path, script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sandbox_agent.supervisor", "--lease", str(lease), "--", sys.executable, "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_an_expired_lease_ends_the_agent_and_a_renewed_one_does_not(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    lease.write_text(lease_text(time.time() + 1.0, 0.1))
    proc = supervise(lease, "import time\nwhile True: time.sleep(1)")
    try:
        for _ in range(8):  # renewed for 2 s: it runs on
            time.sleep(0.25)
            lease.write_text(lease_text(time.time() + 1.0, 0.1))
        assert proc.poll() is None
        started = time.monotonic()
        _, err = proc.communicate(timeout=10)  # no longer renewed: ended within the lease
    finally:
        proc.kill()
    assert proc.returncode == 0 and time.monotonic() - started < 3
    assert b"lease has expired" in err


def test_the_agents_output_is_passed_on_within_the_budget_and_its_status_kept(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    lease.write_text(lease_text(time.time() + 60, 0.5))
    flood = "import os, sys\nos.write(1, b'hello\\n')\nfor _ in range(200): os.write(2, b'x' * 65536)\nsys.exit(3)"
    proc = supervise(lease, flood)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert err.startswith(b"hello\n") and len(err) < 80 * 1024, len(err)  # 12.5 MiB written, 64 KiB passed
    assert b"bytes of the sandbox's output were dropped" in err


def test_a_stop_signal_from_a_process_it_can_see_is_ignored(tmp_path: Path) -> None:
    """Inside a container such a signal comes from the tenant; the engine's `docker stop`
    (sender outside the namespace) is forwarded to the agent (the docker lifecycle tests)."""
    lease = tmp_path / "lease"
    lease.write_text(lease_text(time.time() + 60, 0.5))
    proc = supervise(lease, "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nprint('up', flush=True)\ntime.sleep(60)")
    assert proc.stdout is not None and proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), True)
    assert proc.stderr.readline() == b"up\n"
    proc.send_signal(signal.SIGTERM)  # from a process of its own PID namespace: si_pid is not 0
    time.sleep(0.5)
    assert proc.poll() is None  # only a signal from outside the namespace (si_pid 0) counts
    proc.kill()
    proc.wait(5)
