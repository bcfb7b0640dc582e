"""A user's egress changes (orchestrator/egress/rules.py): kept in the state database and in
memory; a purged user's are forgotten in both, so the defaults apply to that id again."""

from __future__ import annotations

from pathlib import Path

from orchestrator.egress.policy import UserRules, parse_patterns
from orchestrator.egress.rules import EgressRules
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore


def test_a_purged_users_egress_changes_are_forgotten(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite3", STATE_MIGRATIONS)
    store.open()
    try:
        defaults = parse_patterns(["pypi.org"])
        rules = EgressRules(store, defaults)
        allowed = rules.put(5, UserRules(("api.example.com",), ()), actor="admin")
        assert [str(p) for p in allowed] == ["pypi.org", "api.example.com"]
        assert [str(p) for p in EgressRules(store, defaults).allow_for(5)] == ["pypi.org", "api.example.com"]

        with store.write() as tx:  # what the purge's transaction does
            tx.execute("DELETE FROM runtime_overrides WHERE key = ?", ("egress_rules:5",))
        assert [str(p) for p in rules.allow_for(5)] == ["pypi.org", "api.example.com"]  # still in memory
        rules.forget(5)
        assert rules.allow_for(5) == defaults and rules.rules_of(5) == UserRules()
        assert EgressRules(store, defaults).allow_for(5) == defaults
    finally:
        store.close()
