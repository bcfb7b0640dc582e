"""What the collaboration rules read from the orchestrator database: sessions, project
switches and runs.

Either each read opens its own snapshot, or all reads happen inside a transaction the caller
already holds: the start guard runs inside the transaction that inserts the run, where a
second transaction on the same connection is impossible (and would not see the lock holder's
view anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from orchestrator.collaboration.policy import NEW_WORK_TRIGGERS, cross_project_allowed
from orchestrator.sessions.projects import ProjectRepository
from orchestrator.runs.records import RunRecord, RunRepository
from orchestrator.sessions.records import SessionRecord, SessionRepository
from orchestrator.state_store import StateStore, Transaction


class Facts:
    def __init__(self, open_tx: Callable[[], AbstractContextManager[Transaction]]) -> None:
        self._open_tx = open_tx

    @classmethod
    def fresh(cls, store: StateStore) -> Facts:
        return cls(store.read)

    @classmethod
    def within(cls, tx: Transaction) -> Facts:
        @contextmanager
        def reuse() -> Iterator[Transaction]:
            yield tx

        return cls(reuse)

    def session(self, session_id: str) -> SessionRecord | None:
        """A live (not deleted) session."""
        with self._open_tx() as tx:
            record = SessionRepository.get_in(tx, session_id)
        return record if record is not None and not record.deleted else None

    def cross_project_ok(self, source_project: str | None, target_project: str | None) -> bool:
        if source_project == target_project:
            return True
        with self._open_tx() as tx:
            allows = [
                ProjectRepository.get_in(tx, p).cross_project_collaboration if p is not None else True
                for p in (source_project, target_project)
            ]
        return cross_project_allowed(source_project, target_project, allows[0], allows[1])

    def superseded(self, session_id: str, generation: str) -> bool:
        """Whether a newer user run began new work on the session (older work is receive-only)."""
        with self._open_tx() as tx:
            return RunRepository.user_run_started_after_in(tx, session_id, generation, NEW_WORK_TRIGGERS)

    def latest_user_run(self, session_id: str, before: str) -> RunRecord | None:
        with self._open_tx() as tx:
            return RunRepository.latest_user_run_in(tx, session_id, NEW_WORK_TRIGGERS, before=before)

    def run(self, run_id: str) -> RunRecord | None:
        with self._open_tx() as tx:
            return RunRepository.get_in(tx, run_id)

    def session_busy(self, session_id: str) -> bool:
        """Whether the session has a run under way (its own work, or a delivery's)."""
        with self._open_tx() as tx:
            return RunRepository.running_in_session_in(tx, session_id)
