"""Login guessing: a window of wrong tokens per address, then a wait; bounded memory."""

from __future__ import annotations

from orchestrator.console import login_attempts as module
from orchestrator.console.login_attempts import FAILURES_PER_WINDOW, WINDOW_S, Failures, LoginAttempts, after_failure, wait_s


def test_the_wait_starts_at_the_limit_and_ends_with_the_window() -> None:
    assert wait_s(None, 5.0) == 0
    assert wait_s(Failures(FAILURES_PER_WINDOW - 1, 0.0), 1.0) == 0
    assert wait_s(Failures(FAILURES_PER_WINDOW, 0.0), 0.5) == 60
    assert wait_s(Failures(FAILURES_PER_WINDOW, 0.0), WINDOW_S - 0.1) == 1
    assert wait_s(Failures(FAILURES_PER_WINDOW, 0.0), WINDOW_S) == 0
    assert after_failure(None, 3.0) == Failures(1, 3.0)
    assert after_failure(Failures(4, 3.0), 10.0) == Failures(5, 3.0)
    assert after_failure(Failures(40, 3.0), 3.0 + WINDOW_S) == Failures(1, 3.0 + WINDOW_S)


def test_one_address_guessing_does_not_lock_out_another_and_memory_is_bounded(monkeypatch) -> None:
    now = [0.0]
    attempts = LoginAttempts(clock=lambda: now[0])
    for _ in range(FAILURES_PER_WINDOW):
        assert attempts.wait_s("10.0.0.1") == 0
        attempts.failed("10.0.0.1")
    assert attempts.wait_s("10.0.0.1") == 60 and attempts.wait_s("127.0.0.1") == 0
    now[0] = WINDOW_S
    assert attempts.wait_s("10.0.0.1") == 0
    monkeypatch.setattr(module, "MAX_ADDRESSES", 3)
    for n in range(10):
        attempts.failed(f"192.0.2.{n}")
    assert len(attempts._failures) == 3
