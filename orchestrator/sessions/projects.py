"""Project settings: `cross_session_read` and `cross_project_collaboration`."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.clock import now_iso
from orchestrator.state_store import StateStore, Transaction


@dataclass(frozen=True)
class ProjectSettings:
    project_id: str
    cross_session_read: bool = False
    cross_project_collaboration: bool = True


class ProjectRepository:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    def get(self, project_id: str) -> ProjectSettings:
        """Settings of a project; a project nobody configured has the defaults."""
        with self._store.read() as tx:
            return self.get_in(tx, project_id)

    @staticmethod
    def get_in(tx: Transaction, project_id: str) -> ProjectSettings:
        row = tx.one("SELECT * FROM projects WHERE project_id = ?", (project_id,))
        if row is None:
            return ProjectSettings(project_id)
        return ProjectSettings(
            project_id,
            cross_session_read=bool(row["cross_session_read"]),
            cross_project_collaboration=bool(row["cross_project_collaboration"]),
        )

    def update(
        self,
        project_id: str,
        *,
        cross_session_read: bool | None = None,
        cross_project_collaboration: bool | None = None,
    ) -> ProjectSettings:
        with self._store.write() as tx:
            self.ensure(tx, project_id)
            if cross_session_read is not None:
                tx.execute(
                    "UPDATE projects SET cross_session_read = ?, updated_at = ? WHERE project_id = ?",
                    (int(cross_session_read), now_iso(), project_id),
                )
            if cross_project_collaboration is not None:
                tx.execute(
                    "UPDATE projects SET cross_project_collaboration = ?, updated_at = ? WHERE project_id = ?",
                    (int(cross_project_collaboration), now_iso(), project_id),
                )
        return self.get(project_id)

    @staticmethod
    def ensure(tx: Transaction, project_id: str) -> None:
        tx.execute(
            "INSERT OR IGNORE INTO projects (project_id, updated_at) VALUES (?, ?)", (project_id, now_iso())
        )
