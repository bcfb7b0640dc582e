"""The operator's and the admin's changes made at runtime, kept as key-value rows in the state
store (`runtime_overrides`): the runtime identity mode (orchestrator/runs/identity_switch.py)
and each user's egress rules (orchestrator/egress/rules.py). This module owns the table; the
others read and write it only through these functions, inside their own transactions."""

from __future__ import annotations

import sqlite3

from orchestrator.state_store import Migration, Transaction

MIGRATIONS: tuple[Migration, ...] = (
    # 1: one row a key
    Migration(1, """
    CREATE TABLE runtime_overrides (
        key         TEXT PRIMARY KEY,
        value       TEXT NOT NULL,
        actor       TEXT NOT NULL,
        changed_at  TEXT NOT NULL
    );
    """),
)  # fmt: skip


def get(tx: Transaction, key: str) -> sqlite3.Row | None:
    """The row (key, value, actor, changed_at), None when nothing is set."""
    return tx.one("SELECT * FROM runtime_overrides WHERE key = ?", (key,))


def with_prefix(tx: Transaction, prefix: str) -> list[sqlite3.Row]:
    return tx.all("SELECT * FROM runtime_overrides WHERE substr(key, 1, ?) = ?", (len(prefix), prefix))


def put(tx: Transaction, key: str, value: str, *, actor: str, at: str) -> None:
    tx.execute(
        "INSERT INTO runtime_overrides (key, value, actor, changed_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value, actor = excluded.actor,"
        " changed_at = excluded.changed_at",
        (key, value, actor, at),
    )


def delete(tx: Transaction, key: str) -> None:
    tx.execute("DELETE FROM runtime_overrides WHERE key = ?", (key,))
