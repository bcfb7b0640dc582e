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


def test_past_the_budget_the_first_use_of_each_credential_in_a_window_is_still_written() -> None:
    budget = AuditBudget(rows_per_window=2, window_s=60)
    assert [budget.admit(1, "bad_request", 0.0).write for _ in range(3)] == [True, True, False]  # the budget spent
    deploy = "credential=17/deploy grant=gr_1"
    assert budget.admit(1, "allowed", 1.0, deploy).write  # the first use of 17's deploy: written anyway
    assert not budget.admit(1, "allowed", 2.0, deploy).write  # the next one counted under its name
    assert budget.admit(1, "allowed", 3.0, "credential=67/own grant=None").write  # another credential
    assert budget.admit(1, "allowed", 61.0).suppressed_before == {"bad_request": 1, f"allowed {deploy}": 1}
    assert budget.admit(1, "allowed", 62.0, deploy).write  # a new window
