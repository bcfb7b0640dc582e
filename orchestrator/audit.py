"""The audit log: who did what, when, to which session, as which identities."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from orchestrator import metrics
from orchestrator.clock import now_iso
from orchestrator.state_store import Migration, StateStore, Transaction

MIGRATIONS: tuple[Migration, ...] = (
    # 1: the audit log
    Migration(1, """
    CREATE TABLE audit_log (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        at            TEXT NOT NULL,
        actor         TEXT NOT NULL,
        action        TEXT NOT NULL,
        session_id    TEXT,
        owner_user_id INTEGER,
        runtime_user_id INTEGER,
        detail        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_by_action ON audit_log (action, id);
    """),
)  # fmt: skip


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


@dataclass(frozen=True)
class AuditFilter:
    """Which entries a listing shows; None is "any". `user_id` matches the owner or the
    runtime user; `tool` and `outcome` a tool call's; `since`/`until` are ISO 8601 UTC times
    (inclusive, exclusive); `run_id` a tool call's run; `before` an entry id (the next page)."""

    action: str | None = None
    session_id: str | None = None
    user_id: int | None = None
    run_id: str | None = None
    tool: str | None = None
    outcome: str | None = None
    since: str | None = None
    until: str | None = None
    before: int | None = None


def where_clause(found: AuditFilter) -> tuple[str, list[object]]:
    """Pure: the SQL condition (with its parameters) of a filter."""
    clauses: list[str] = []
    params: list[object] = []
    for sql, value in (
        ("action = ?", found.action),
        ("session_id = ?", found.session_id),
        ("json_extract(detail, '$.run_id') = ?", found.run_id),
        ("json_extract(detail, '$.tool') = ?", found.tool),
        ("json_extract(detail, '$.outcome') = ?", found.outcome),
        ("at >= ?", found.since),
        ("at < ?", found.until),
        ("id < ?", found.before),
    ):
        if value is not None:
            clauses.append(sql)
            params.append(value)
    if found.user_id is not None:
        clauses.append("(owner_user_id = ? OR runtime_user_id = ?)")
        params += [found.user_id, found.user_id]
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def entries(
    store: StateStore,
    *,
    action: str | None = None,
    session_id: str | None = None,
    limit: int = 100,
    where: AuditFilter | None = None,
    oldest_first: bool = False,
) -> list[AuditEntry]:
    found = where if where is not None else AuditFilter(action=action, session_id=session_id)
    clause, params = where_clause(found)
    order = "ASC" if oldest_first else "DESC"
    with store.read() as tx:
        rows = tx.all(f"SELECT * FROM audit_log {clause} ORDER BY id {order} LIMIT ?", (*params, limit))
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
