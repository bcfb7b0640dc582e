"""The state store's tables of this package (preview links): their migrations, under the store's one
version numbering (orchestrator/state_schema.py puts every package's together). Append only: a
released migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # preview links to a port a sandbox listens on (docs/previews.md)
    Migration(9, """
    CREATE TABLE previews (
        preview_id    TEXT PRIMARY KEY,
        token         TEXT NOT NULL UNIQUE,
        user_id       INTEGER NOT NULL,
        run_id        TEXT NOT NULL,
        session_id    TEXT NOT NULL,
        port          INTEGER NOT NULL,
        created_at    TEXT NOT NULL,
        expires_at    TEXT NOT NULL
    );
    CREATE INDEX previews_by_expiry ON previews (expires_at);
    """),
)
