"""Per-user changes to the egress allow list, kept in SQLite (`runtime_overrides`, one row a
user) and in memory. A change takes effect at the user's next connection: the proxy asks
`allow_for` at every connection, and a PUT replaces the user's entry in one assignment."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from orchestrator import audit, runtime_overrides
from orchestrator.clock import now_iso
from orchestrator.egress.policy import HostPattern, UserRules, effective_allow, parse_patterns
from orchestrator.state_store import StateStore, Transaction

KEY_PREFIX = "egress_rules:"


def rules_key(user_id: int) -> str:
    return f"{KEY_PREFIX}{user_id}"


def forget_in(tx: Transaction, user_id: int) -> None:
    """Drop the user's row in the caller's transaction (a purge's tombstone)."""
    runtime_overrides.delete(tx, rules_key(user_id))


class EgressRules:
    def __init__(self, store: StateStore, defaults: Sequence[HostPattern]) -> None:
        self._store = store
        self.defaults = tuple(defaults)
        self._lock = threading.Lock()  # writers only; readers see whole dict entries
        self._rules: dict[int, UserRules] = {}
        self._effective: dict[int, tuple[HostPattern, ...]] = {}
        with store.read() as tx:
            rows = runtime_overrides.with_prefix(tx, KEY_PREFIX)
        for row in rows:
            user_id = int(row["key"][len(KEY_PREFIX) :])
            value = json.loads(row["value"])
            self._set(user_id, UserRules(tuple(value.get("allow", ())), tuple(value.get("remove", ()))))

    def _set(self, user_id: int, rules: UserRules) -> None:
        effective = effective_allow(self.defaults, rules)
        self._rules[user_id] = rules
        self._effective[user_id] = effective

    def rules_of(self, user_id: int) -> UserRules:
        return self._rules.get(user_id, UserRules())

    def allow_for(self, user_id: int) -> tuple[HostPattern, ...]:
        return self._effective.get(user_id, self.defaults)

    def forget(self, user_id: int) -> None:
        """A purged user's changes are gone (the purge deleted their row): the defaults apply."""
        with self._lock:
            self._rules.pop(user_id, None)
            self._effective.pop(user_id, None)

    def put(self, user_id: int, rules: UserRules, *, actor: str) -> tuple[HostPattern, ...]:
        """Replace the user's changes (validated first: a bad pattern changes nothing)."""
        canonical = UserRules(
            tuple(str(p) for p in parse_patterns(rules.allow)), tuple(str(p) for p in parse_patterns(rules.remove))
        )
        effective_allow(self.defaults, canonical)
        value = json.dumps({"allow": list(canonical.allow), "remove": list(canonical.remove)})
        with self._lock:
            with self._store.write() as tx:
                runtime_overrides.put(tx, rules_key(user_id), value, actor=actor, at=now_iso())
                audit.record(
                    tx, actor=actor, action="egress_rules_set", runtime_user_id=user_id,
                    allow=list(canonical.allow), remove=list(canonical.remove),
                )  # fmt: skip
            self._set(user_id, canonical)
        return self.allow_for(user_id)
