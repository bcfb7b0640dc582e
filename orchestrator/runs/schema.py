"""The state store's tables of this package (runs): their migrations, under the store's one version
numbering (orchestrator/state_schema.py puts every package's together). Append only: a released
migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # runs
    Migration(1, """
    CREATE TABLE runs (
        run_id             TEXT PRIMARY KEY,
        session_id         TEXT NOT NULL,
        trigger            TEXT NOT NULL,
        agent_id           TEXT NOT NULL,
        identity_mode      TEXT NOT NULL,
        owner_user_id      INTEGER NOT NULL,
        execution_user_id  INTEGER,
        runtime_user_id    INTEGER NOT NULL,
        speaker_user_id    INTEGER,
        delivery_id        TEXT,
        status             TEXT NOT NULL,
        started_at         TEXT NOT NULL,
        ended_at           TEXT
    );
    CREATE INDEX runs_by_session ON runs (session_id, started_at);
    """),
    # a run's last tool call (idle_runs.py ends runs idle for too long); the partial index keeps
    # the sweep to the running runs, however many have ended
    Migration(4, """
    ALTER TABLE runs ADD COLUMN last_activity_at TEXT;
    CREATE INDEX runs_running ON runs (started_at) WHERE status = 'running';
    """),
    # a user's last tool call: runs by runtime user (last_activity_at is not in the index, so the
    # write of every tool call does not touch it)
    Migration(6, """
    CREATE INDEX runs_by_runtime_user ON runs (runtime_user_id);
    """),
)
