"""The state store's tables of this package (credentials, the key check and delegation grants): their
migrations, under the store's one version numbering (orchestrator/state_schema.py puts every
package's together). Append only: a released migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # per-user credentials, encrypted with the operator's key, and their delegation grants
    # (docs/credentials.md); `secret` is a Fernet token, never clear
    Migration(12, """
    CREATE TABLE credentials (
        user_id       INTEGER NOT NULL,
        name          TEXT NOT NULL,
        hosts         TEXT NOT NULL,
        header        TEXT NOT NULL,
        template      TEXT NOT NULL,
        env           TEXT,
        secret        BLOB NOT NULL,
        created_at    TEXT NOT NULL,
        last_used_at  TEXT,
        PRIMARY KEY (user_id, name)
    );
    CREATE TABLE credentials_key_check (
        id            INTEGER PRIMARY KEY CHECK (id = 1),
        token         BLOB NOT NULL
    );
    CREATE TABLE credential_grants (
        grant_id         TEXT PRIMARY KEY,
        grantor_user_id  INTEGER NOT NULL,
        credential       TEXT NOT NULL,
        grantee_user_id  INTEGER,
        session_id       TEXT NOT NULL,
        created_at       TEXT NOT NULL,
        expires_at       TEXT NOT NULL,
        revoked_at       TEXT
    );
    CREATE INDEX credential_grants_by_grantor ON credential_grants (grantor_user_id);
    CREATE INDEX credential_grants_by_grantee ON credential_grants (grantee_user_id);
    """),
)
