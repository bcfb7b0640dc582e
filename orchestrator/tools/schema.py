"""The state store's tables of this package (recorded tool-call results): their migrations, under the
store's one version numbering (orchestrator/state_schema.py puts every package's together). Append
only: a released migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # recorded tool-call results by (run, tool_call_id), so a repeated call returns the first
    # one's result instead of running again (call_records.py)
    Migration(7, """
    CREATE TABLE tool_call_results (
        run_id        TEXT NOT NULL,
        tool_call_id  TEXT NOT NULL,
        tool          TEXT NOT NULL,
        digest        TEXT NOT NULL,
        status        TEXT NOT NULL,
        body          TEXT,
        instance      TEXT NOT NULL,
        started_at    TEXT NOT NULL,
        completed_at  TEXT,
        expires_at    TEXT NOT NULL,
        PRIMARY KEY (run_id, tool_call_id)
    );
    CREATE INDEX tool_call_results_by_expiry ON tool_call_results (expires_at);
    """),
)
