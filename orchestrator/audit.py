"""The audit log: who did what, when, to which session, as which identities."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from orchestrator import metrics
from orchestrator.clock import now_iso
from orchestrator.state_store import StateStore, Transaction


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: str
    actor: str
    action: str
    session_id: str | None
    owner_user_id: int | None
    runtime_user_id: int | None
    detail: dict[str, Any]


def record(
    tx: Transaction,
    *,
    actor: str,
    action: str,
    session_id: str | None = None,
    owner_user_id: int | None = None,
    runtime_user_id: int | None = None,
    **detail: Any,
) -> int:
    """Append one entry; returns its id (for `complete`)."""
    started = time.perf_counter()
    cursor = tx.execute(
        "INSERT INTO audit_log (at, actor, action, session_id, owner_user_id, runtime_user_id, detail)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (now_iso(), actor, action, session_id, owner_user_id, runtime_user_id, json.dumps(detail, sort_keys=True)),
    )
    metrics.AUDIT_WRITE_SECONDS.observe(time.perf_counter() - started)
    return int(cursor.lastrowid or 0)


def complete(tx: Transaction, entry_id: int, **detail: Any) -> None:
    """Replace the detail of an entry written before its outcome was known (a tool call is
    audited before it runs, so a crash mid-call still leaves its row)."""
    tx.execute("UPDATE audit_log SET detail = ? WHERE id = ?", (json.dumps(detail, sort_keys=True), entry_id))


def entries(store: StateStore, *, action: str | None = None, session_id: str | None = None, limit: int = 100) -> list[AuditEntry]:
    clauses, params = [], []
    if action is not None:
        clauses.append("action = ?")
        params.append(action)
    if session_id is not None:
        clauses.append("session_id = ?")
        params.append(session_id)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    with store.read() as tx:
        rows = tx.all(f"SELECT * FROM audit_log {where} ORDER BY id DESC LIMIT ?", (*params, limit))
    return [
        AuditEntry(
            id=row["id"],
            at=row["at"],
            actor=row["actor"],
            action=row["action"],
            session_id=row["session_id"],
            owner_user_id=row["owner_user_id"],
            runtime_user_id=row["runtime_user_id"],
            detail=json.loads(row["detail"]),
        )
        for row in rows
    ]
