"""The state store's tables of this package (projects, sessions and the runtime users that ran in
each): their migrations, under the store's one version numbering (orchestrator/state_schema.py puts
every package's together). Append only: a released migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # projects, sessions, the runtime users of each session
    Migration(1, """
    CREATE TABLE projects (
        project_id                   TEXT PRIMARY KEY,
        cross_session_read           INTEGER NOT NULL DEFAULT 0,
        cross_project_collaboration  INTEGER NOT NULL DEFAULT 1,
        updated_at                   TEXT NOT NULL
    );
    CREATE TABLE sessions (
        session_id            TEXT PRIMARY KEY,
        owner_user_id         INTEGER NOT NULL,
        project_id            TEXT,
        channel               TEXT NOT NULL,
        group_channel         TEXT,
        group_chat_id         TEXT,
        parent_session_id     TEXT,
        title                 TEXT,
        last_runtime_user_id  INTEGER,
        allow_cross_read      INTEGER NOT NULL DEFAULT 1,
        cross_private         INTEGER NOT NULL DEFAULT 0,
        archived              INTEGER NOT NULL DEFAULT 0,
        pinned                INTEGER NOT NULL DEFAULT 0,
        created_at            TEXT NOT NULL,
        updated_at            TEXT NOT NULL,
        deleted_at            TEXT,
        cleanup_done_at       TEXT
    );
    CREATE INDEX sessions_by_owner ON sessions (owner_user_id, project_id);
    CREATE TABLE session_runtime_users (
        session_id  TEXT NOT NULL,
        user_id     INTEGER NOT NULL,
        first_at    TEXT NOT NULL,
        PRIMARY KEY (session_id, user_id)
    );
    """),
    # a group chat's sessions (the lookups a bot makes, orchestrator/http/routes_lookups.py)
    Migration(6, """
    CREATE INDEX sessions_by_group ON sessions (group_channel, group_chat_id) WHERE group_channel IS NOT NULL;
    """),
)
