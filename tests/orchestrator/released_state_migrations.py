"""The state store's migrations as they were released before each package owned its own
(copied from orchestrator/state_store.py at the commit that split them): a data dir migrated by
that code must open and keep working, and a new one must get the same schema."""

# fmt: off
RELEASED_MIGRATIONS: tuple[str, ...] = (
    # 1: users, groups, projects, sessions, runs, audit, runtime overrides
    """
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
    CREATE TABLE audit_log (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        at            TEXT NOT NULL,
        actor         TEXT NOT NULL,
        action        TEXT NOT NULL,
        session_id    TEXT,
        owner_user_id INTEGER,
        runtime_user_id INTEGER,
        detail        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_by_action ON audit_log (action, id);
    CREATE TABLE runtime_overrides (
        key         TEXT PRIMARY KEY,
        value       TEXT NOT NULL,
        actor       TEXT NOT NULL,
        changed_at  TEXT NOT NULL
    );
    """,
    # 2: outgoing deliveries of send_file / send_image (orchestrator/deliveries/outbox.py)
    """
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
    """,
    # 3: each group workspace's own gid (orchestrator/users/group_gids.py); never reused
    """
    CREATE TABLE group_gids (
        channel       TEXT NOT NULL,
        chat_id       TEXT NOT NULL,
        gid           INTEGER NOT NULL UNIQUE,
        allocated_at  TEXT NOT NULL,
        PRIMARY KEY (channel, chat_id)
    );
    """,
    # 4: a run's last tool call (orchestrator/run_sweeper.py ends runs idle for too long); the
    # partial index keeps the sweep to the running runs, however many have ended
    """
    ALTER TABLE runs ADD COLUMN last_activity_at TEXT;
    CREATE INDEX runs_running ON runs (started_at) WHERE status = 'running';
    """,
    # 5: the public uploads the orchestrator published (orchestrator/deliveries/public_uploads.py): only
    # these names are served, never a name a sandbox wrote into its uploads dir itself
    """
    CREATE TABLE published_uploads (
        owner_user_id  INTEGER NOT NULL,
        file_name      TEXT NOT NULL,
        published_at   TEXT NOT NULL,
        PRIMARY KEY (owner_user_id, file_name)
    );
    """,
    # 6: the lookups a bot makes (orchestrator/http/routes_lookups.py): a group chat's sessions,
    # and a user's last tool call (runs by runtime user; last_activity_at is not in the index, so
    # the write of every tool call does not touch it)
    """
    CREATE INDEX sessions_by_group ON sessions (group_channel, group_chat_id) WHERE group_channel IS NOT NULL;
    CREATE INDEX runs_by_runtime_user ON runs (runtime_user_id);
    """,
    # 7: recorded tool-call results by (run, tool_call_id), so a repeated call returns the first
    # one's result instead of running again (orchestrator/tools/call_records.py)
    """
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
    """,
    # 8: people named by a chat platform's id, each mapped once to a user id of ours
    # (orchestrator/users/identities.py); ids are allocated from the top of the range down
    """
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
    """,
    # 9: preview links to a port a sandbox listens on (orchestrator/previews/, docs/previews.md)
    """
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
    """,
    # 10: purged users' tombstones (their ids
    # are never used again, orchestrator/users/purge.py) and per-user CPU and memory
    # (orchestrator/users/resources.py)
    """
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
    """,
    # 11: sandbox templates an admin defines and who gets which (orchestrator/templates/,
    # docs/templates.md); `image` is the last image that built, kept while a newer recipe fails
    """
    CREATE TABLE templates (
        name          TEXT PRIMARY KEY,
        recipe        TEXT NOT NULL,
        recipe_hash   TEXT,
        status        TEXT NOT NULL,
        image         TEXT,
        image_hash    TEXT,
        log           TEXT NOT NULL DEFAULT '',
        error         TEXT,
        updated_at    TEXT NOT NULL
    );
    CREATE TABLE template_assignments (
        kind          TEXT NOT NULL,
        subject       TEXT NOT NULL,
        template      TEXT NOT NULL,
        updated_at    TEXT NOT NULL,
        PRIMARY KEY (kind, subject)
    );
    CREATE INDEX template_assignments_by_template ON template_assignments (template);
    """,
    # 12: per-user credentials, encrypted with the operator's key, and their delegation grants
    # (orchestrator/credentials/, docs/credentials.md); `secret` is a Fernet token, never clear
    """
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
    """,
)
