"""A run's record and its repository: the rows of `runs`, read and written inside a state-store transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from orchestrator.identity import (
    RunIdentity,
    Trigger,
)
from orchestrator.identity import IdentityMode
from orchestrator.state_store import StateStore, Transaction

class RunStatus(str, Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    session_id: str
    trigger: Trigger
    agent_id: str
    identity_mode: IdentityMode
    owner_user_id: int
    execution_user_id: int | None
    runtime_user_id: int
    speaker_user_id: int | None
    delivery_id: str | None
    status: RunStatus
    started_at: str
    ended_at: str | None

    @property
    def identity(self) -> RunIdentity:
        return RunIdentity(
            mode=self.identity_mode,
            owner_user_id=self.owner_user_id,
            execution_user_id=self.execution_user_id,
            runtime_user_id=self.runtime_user_id,
        )


# The largest `before` cursor a page of runs takes (SQLite's rowid range).
MAX_RUN_SEQ = 2**63 - 1


def person_of(run: RunRecord) -> int:
    """The person a run is for: its speaker, else the session owner (web, scheduled, ...)."""
    return run.speaker_user_id if run.speaker_user_id is not None else run.owner_user_id


def run_from_row(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        session_id=row["session_id"],
        trigger=Trigger(row["trigger"]),
        agent_id=row["agent_id"],
        identity_mode=IdentityMode(row["identity_mode"]),
        owner_user_id=row["owner_user_id"],
        execution_user_id=row["execution_user_id"],
        runtime_user_id=row["runtime_user_id"],
        speaker_user_id=row["speaker_user_id"],
        delivery_id=row["delivery_id"],
        status=RunStatus(row["status"]),
        started_at=row["started_at"],
        ended_at=row["ended_at"],
    )


class RunRepository:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    @staticmethod
    def get_in(tx: Transaction, run_id: str) -> RunRecord | None:
        row = tx.one("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return run_from_row(row) if row else None

    def get(self, run_id: str) -> RunRecord | None:
        with self._store.read() as tx:
            return self.get_in(tx, run_id)

    def running_in_session(self, session_id: str) -> list[RunRecord]:
        with self._store.read() as tx:
            rows = tx.all("SELECT * FROM runs WHERE session_id = ? AND status = 'running'", (session_id,))
        return [run_from_row(row) for row in rows]

    @staticmethod
    def running_in_session_in(tx: Transaction, session_id: str) -> bool:
        return tx.one("SELECT 1 FROM runs WHERE session_id = ? AND status = 'running' LIMIT 1", (session_id,)) is not None

    @staticmethod
    def touch_in(tx: Transaction, run_id: str, at: str) -> None:
        """Note a tool call of the run (in the transaction that audits it: no write of its own)."""
        tx.execute("UPDATE runs SET last_activity_at = ? WHERE run_id = ?", (at, run_id))

    def idle_since(self, cutoff: str) -> list[str]:
        """Running runs whose last tool call (or start, without one) is older than `cutoff`."""
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT run_id FROM runs WHERE status = 'running'"
                " AND COALESCE(last_activity_at, started_at) < ? ORDER BY started_at",
                (cutoff,),
            )
        return [row["run_id"] for row in rows]

    @staticmethod
    def latest_user_run_in(
        tx: Transaction, session_id: str, triggers: Collection[Trigger], *, before: str
    ) -> RunRecord | None:
        """The newest run of the session with one of `triggers` and no delivery, started before `before`."""
        marks = ", ".join("?" for _ in triggers)
        row = tx.one(
            f"SELECT * FROM runs WHERE session_id = ? AND delivery_id IS NULL AND trigger IN ({marks})"
            " AND started_at < ? ORDER BY started_at DESC LIMIT 1",
            (session_id, *(t.value for t in triggers), before),
        )
        return run_from_row(row) if row else None

    @staticmethod
    def user_run_started_after_in(tx: Transaction, session_id: str, run_id: str, triggers: Collection[Trigger]) -> bool:
        """Whether a run with one of `triggers` and no delivery started in the session after `run_id`."""
        marks = ", ".join("?" for _ in triggers)
        row = tx.one(
            f"SELECT 1 FROM runs WHERE session_id = ? AND delivery_id IS NULL AND trigger IN ({marks})"
            " AND run_id != ? AND started_at > (SELECT started_at FROM runs WHERE run_id = ?) LIMIT 1",
            (session_id, *(t.value for t in triggers), run_id, run_id),
        )
        return row is not None

    def page_of_session(self, session_id: str, *, before: int | None, limit: int) -> list[tuple[int, RunRecord]]:
        """The session's runs, newest first, as (seq, run): `seq` (the row's insertion order) is
        the cursor of the next page (`before`)."""
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT rowid AS seq, * FROM runs WHERE session_id = ? AND rowid < ? ORDER BY rowid DESC LIMIT ?",
                (session_id, MAX_RUN_SEQ if before is None else before, limit),
            )
        return [(row["seq"], run_from_row(row)) for row in rows]

    def last_activity_of_user(self, runtime_user_id: int) -> str | None:
        """When a run of this runtime user last had a tool call (or started, without one)."""
        with self._store.read() as tx:
            row = tx.one(
                "SELECT MAX(COALESCE(last_activity_at, started_at)) AS at FROM runs WHERE runtime_user_id = ?",
                (runtime_user_id,),
            )
        return row["at"] if row else None
