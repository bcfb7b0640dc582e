"""The state store's tables of this package (deliveries and published uploads): their migrations,
under the store's one version numbering (orchestrator/state_schema.py puts every package's
together). Append only: a released migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # outgoing deliveries of send_file / send_image (outbox.py)
    Migration(2, """
    CREATE TABLE deliveries (
        delivery_id      TEXT PRIMARY KEY,
        run_id           TEXT NOT NULL,
        session_id       TEXT NOT NULL,
        runtime_user_id  INTEGER NOT NULL,
        tool             TEXT NOT NULL,
        kind             TEXT NOT NULL,
        file_name        TEXT NOT NULL,
        media_type       TEXT NOT NULL,
        size             INTEGER NOT NULL,
        sha256           TEXT NOT NULL,
        source           TEXT NOT NULL,
        created_at       TEXT NOT NULL,
        expires_at       TEXT NOT NULL,
        fetched_at       TEXT
    );
    CREATE INDEX deliveries_by_run ON deliveries (run_id);
    CREATE INDEX deliveries_by_session ON deliveries (session_id);
    CREATE INDEX deliveries_by_expiry ON deliveries (expires_at);
    """),
    # the public uploads the orchestrator published (public_uploads.py): only these names are
    # served, never a name a sandbox wrote into its uploads dir itself
    Migration(5, """
    CREATE TABLE published_uploads (
        owner_user_id  INTEGER NOT NULL,
        file_name      TEXT NOT NULL,
        published_at   TEXT NOT NULL,
        PRIMARY KEY (owner_user_id, file_name)
    );
    """),
)
