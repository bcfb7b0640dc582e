"""Purged users' tombstones: a purged user id is refused (`410 user_purged`) on every later
request and never handed out again (docs/admin-console.md, "Purging a user")."""

from __future__ import annotations

import threading

from orchestrator.clock import now_iso
from orchestrator.errors import Gone
from orchestrator.state_store import StateStore, Transaction


class UserPurged(Gone):
    code = "user_purged"


def purged_error(user_id: int, field: str = "user_id") -> UserPurged:
    return UserPurged(f"user {user_id} was purged; its id is never used again", field=field, user_id=user_id)


class PurgedUsers:
    """The tombstones, read from memory (every request of a user id asks): loaded once at
    start, added to when a purge commits."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        with store.read() as tx:
            self._ids = frozenset(row["user_id"] for row in tx.all("SELECT user_id FROM purged_users"))

    def is_purged(self, user_id: int) -> bool:
        return user_id in self._ids

    def refuse(self, user_id: int, field: str = "user_id") -> int:
        """The id when it is not purged; `UserPurged` (410) when it is."""
        if user_id in self._ids:
            raise purged_error(user_id, field)
        return user_id

    def mark_in(self, tx: Transaction, user_id: int, *, actor: str) -> bool:
        """Write the tombstone (once); in memory from the commit on. False when it was there."""
        cursor = tx.execute(
            "INSERT OR IGNORE INTO purged_users (user_id, purged_at, actor) VALUES (?, ?, ?)", (user_id, now_iso(), actor)
        )

        def remember() -> None:
            with self._lock:
                self._ids = self._ids | {user_id}

        tx.on_commit(remember)
        return cursor.rowcount == 1
