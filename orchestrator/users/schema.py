"""The state store's tables of this package (users, group memberships, group gids, platform
identities, purged users, resource overrides): their migrations, under the store's one version
numbering (orchestrator/state_schema.py puts every package's together). Append only: a released
migration is never edited."""

from __future__ import annotations

from orchestrator.state_store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    # users and the groups they are members of
    Migration(1, """
    CREATE TABLE users (
        user_id       INTEGER PRIMARY KEY,
        display_name  TEXT,
        backend       TEXT,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL
    );
    CREATE TABLE group_members (
        channel    TEXT NOT NULL,
        chat_id    TEXT NOT NULL,
        user_id    INTEGER NOT NULL,
        joined_at  TEXT NOT NULL,
        PRIMARY KEY (channel, chat_id, user_id)
    );
    CREATE INDEX group_members_by_user ON group_members (user_id);
    """),
    # each group workspace's own gid (group_gids.py); never reused
    Migration(3, """
    CREATE TABLE group_gids (
        channel       TEXT NOT NULL,
        chat_id       TEXT NOT NULL,
        gid           INTEGER NOT NULL UNIQUE,
        allocated_at  TEXT NOT NULL,
        PRIMARY KEY (channel, chat_id)
    );
    """),
    # people named by a chat platform's id, each mapped once to a user id of ours (identities.py);
    # ids are allocated from the top of the range down
    Migration(8, """
    CREATE TABLE identities (
        platform      TEXT NOT NULL,
        external_id   TEXT NOT NULL,
        user_id       INTEGER NOT NULL,
        display_name  TEXT,
        created_at    TEXT NOT NULL,
        PRIMARY KEY (platform, external_id)
    );
    CREATE INDEX identities_by_user ON identities (user_id);
    CREATE TABLE identity_allocation (
        id            INTEGER PRIMARY KEY CHECK (id = 1),
        next_user_id  INTEGER NOT NULL
    );
    """),
    # purged users' tombstones (their ids are never used again, purge.py) and per-user CPU
    # and memory (resources.py)
    Migration(10, """
    CREATE TABLE purged_users (
        user_id    INTEGER PRIMARY KEY,
        purged_at  TEXT NOT NULL,
        actor      TEXT NOT NULL
    );
    CREATE TABLE user_resources (
        user_id     INTEGER PRIMARY KEY,
        cpus        REAL,
        memory_mb   INTEGER,
        actor       TEXT NOT NULL,
        changed_at  TEXT NOT NULL
    );
    """),
)
