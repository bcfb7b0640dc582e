"""The orchestrator's SQLite state (`state/orchestrator.sqlite3`).

WAL mode, a busy timeout, `BEGIN IMMEDIATE` for every write (so two writers never
deadlock on a lock upgrade), one connection per thread, and forward-only versioned
migrations. A database written by a newer orchestrator refuses to open.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from orchestrator import metrics

BUSY_TIMEOUT_MS = 10_000

# Append only: a released migration is never edited; the version is its 1-based index.
MIGRATIONS: tuple[str, ...] = (
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
    # 10: sandbox templates an admin defines and who gets which (orchestrator/templates/,
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
)


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer orchestrator; opening it could corrupt it."""


class StateStore:
    def __init__(self, path: Path, migrations: Sequence[str] = MIGRATIONS, *, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.path = Path(path)
        self._migrations = tuple(migrations)
        self._synchronous = synchronous
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        # Writers of this process queue here instead of in SQLite's busy handler, whose sleeps
        # (up to 100 ms a try) starve unlucky writers under contention: p99 waits of >1 s with
        # 20 threads. Other processes still meet SQLite's lock and the busy timeout.
        self._write_lock = threading.RLock()  # re-entry still fails fast, in SQLite: no nested BEGIN

    @property
    def code_version(self) -> int:
        return len(self._migrations)

    def open(self) -> None:
        """Create the file when missing, refuse a newer schema, apply pending migrations."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o700)
        conn = self.connection()
        found = conn.execute("PRAGMA user_version").fetchone()[0]
        if found > self.code_version:
            self.close()
            raise SchemaTooNewError(
                f"{self.path} has schema version {found}, but this orchestrator only knows "
                f"versions up to {self.code_version}: run a newer orchestrator or restore a "
                "backup made by this version"
            )
        for version in range(found + 1, self.code_version + 1):
            with self.write() as tx:
                tx.executescript_in_tx(self._migrations[version - 1])
                tx.execute(f"PRAGMA user_version = {version}")

    def schema_version(self) -> int:
        return self.connection().execute("PRAGMA user_version").fetchone()[0]

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            os.chmod(self.path, 0o600)
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        """A write transaction taken with BEGIN IMMEDIATE; committed on success."""
        conn = self.connection()
        started = time.perf_counter()
        if not self._write_lock.acquire(timeout=BUSY_TIMEOUT_MS / 1000):
            raise sqlite3.OperationalError("database is locked (waited for this process's other writers)")
        try:
            conn.execute("BEGIN IMMEDIATE")
            tx = Transaction(conn)
            try:
                yield tx
            except BaseException:
                conn.execute("ROLLBACK")
                tx.run_hooks(tx.rollback_hooks)
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                tx.run_hooks(tx.rollback_hooks)
                raise
        finally:
            self._write_lock.release()
        tx.run_hooks(tx.commit_hooks)
        metrics.STATE_WRITE_SECONDS.observe(time.perf_counter() - started)

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        """A consistent read snapshot."""
        conn = self.connection()
        conn.execute("BEGIN")
        try:
            yield Transaction(conn)
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._connections_lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()


class Transaction:
    """A thin view of a connection inside a transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        # In-memory state kept in step with the rows (the host-copy counters): what to do once
        # the transaction committed, or what to undo when it rolled back.
        self.commit_hooks: list[Callable[[], None]] = []
        self.rollback_hooks: list[Callable[[], None]] = []

    def on_commit(self, hook: Callable[[], None]) -> None:
        self.commit_hooks.append(hook)

    def on_rollback(self, hook: Callable[[], None]) -> None:
        self.rollback_hooks.append(hook)

    @staticmethod
    def run_hooks(hooks: list[Callable[[], None]]) -> None:
        for hook in hooks:
            hook()

    def execute(self, sql: str, params: Sequence[object] | dict[str, object] = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, params)

    def one(self, sql: str, params: Sequence[object] | dict[str, object] = ()) -> sqlite3.Row | None:
        return self._conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[object] | dict[str, object] = ()) -> list[sqlite3.Row]:
        return self._conn.execute(sql, params).fetchall()

    def executescript_in_tx(self, script: str) -> None:
        # sqlite3.executescript would COMMIT first; run the statements one by one instead.
        for statement in _split_statements(script):
            self._conn.execute(statement)


def _split_statements(script: str) -> list[str]:
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete SQL statement in migration: {buffer.strip()[:80]}")
    return statements
