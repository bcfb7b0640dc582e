"""The per-user budget of egress audit rows, as a function of the clock."""

from __future__ import annotations

from orchestrator.egress.audit_budget import AuditBudget


def test_rows_past_the_budget_are_counted_and_reported_once_in_the_next_window() -> None:
    budget = AuditBudget(rows_per_window=3, window_s=60)
    admitted = [budget.admit(1, "bad_request", 0.0) for _ in range(5)]
    assert [a.write for a in admitted] == [True, True, True, False, False]
    assert [a.first_suppressed for a in admitted] == [False, False, False, True, False]
    assert budget.admit(2, "allowed", 1.0).write  # another user has its own budget
    later = budget.admit(1, "allowed", 61.0)
    assert later.write and later.suppressed_before == {"bad_request": 2}
    assert budget.admit(1, "allowed", 62.0).suppressed_before == {}
