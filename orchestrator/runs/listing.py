"""The admin's list of runs (GET /v1/admin/runs and the console's runs page): active (still
running) or recent, by user, session or group chat; and one run's tool calls in order."""

from __future__ import annotations

from dataclasses import dataclass

from mounts import ids
from mounts.layout import GroupRef
from orchestrator import audit
from orchestrator.errors import InvalidInput
from orchestrator.runs.records import RunRecord, run_from_row
from orchestrator.state_store import StateStore


@dataclass(frozen=True)
class RunFilter:
    active: bool = False  # only the running ones
    user_id: int | None = None  # as owner, execution or runtime user
    session_id: str | None = None
    group: GroupRef | None = None


@dataclass(frozen=True)
class ListedRun:
    run: RunRecord
    last_activity_at: str | None
    group: GroupRef | None


def run_filter(state: str, user_id: int | None, session_id: str | None, channel: str | None, chat_id: str | None) -> RunFilter:
    """Pure: the filter of GET /v1/admin/runs (a group needs both channel and chat_id)."""
    if (channel is None) != (chat_id is None):
        raise InvalidInput("a group is named by both channel and chat_id", field="channel" if channel is None else "chat_id")
    try:
        group = GroupRef(ids.name(channel, "channel"), ids.chat_id(chat_id, "chat_id")) if channel and chat_id else None
        session = ids.session_id(session_id, "session_id") if session_id is not None else None
    except ids.InvalidIdentifier as exc:
        raise InvalidInput(exc.message, field=exc.field) from None
    return RunFilter(active=state == "active", user_id=user_id, session_id=session, group=group)


def where_clause(wanted: RunFilter) -> tuple[str, list[object]]:
    """Pure: the SQL condition of a filter over `runs r JOIN sessions s`."""
    clauses: list[str] = []
    params: list[object] = []
    if wanted.active:
        clauses.append("r.status = 'running'")
    if wanted.user_id is not None:
        clauses.append("(r.owner_user_id = ? OR r.runtime_user_id = ? OR r.execution_user_id = ?)")
        params += [wanted.user_id] * 3
    if wanted.session_id is not None:
        clauses.append("r.session_id = ?")
        params.append(wanted.session_id)
    if wanted.group is not None:
        clauses.append("s.group_channel = ? AND s.group_chat_id = ?")
        params += [wanted.group.channel, wanted.group.chat_id]
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def list_runs(store: StateStore, wanted: RunFilter, *, limit: int) -> list[ListedRun]:
    """The newest runs first."""
    clause, params = where_clause(wanted)
    with store.read() as tx:
        rows = tx.all(
            "SELECT r.*, s.group_channel, s.group_chat_id FROM runs r JOIN sessions s ON s.session_id = r.session_id"
            f" {clause} ORDER BY r.started_at DESC LIMIT ?",
            (*params, limit),
        )
    return [
        ListedRun(
            run_from_row(row),
            row["last_activity_at"],
            GroupRef(row["group_channel"], row["group_chat_id"]) if row["group_channel"] is not None else None,
        )
        for row in rows
    ]


def tool_calls_of(store: StateStore, run_id: str, *, limit: int = 1000) -> list[audit.AuditEntry]:
    """A run's tool calls in the order they came, each with its duration and outcome."""
    return audit.entries(store, where=audit.AuditFilter(action="tool.call", run_id=run_id), limit=limit, oldest_first=True)
