"""The orchestrator's SQLite state (`state/orchestrator.sqlite3`).

WAL mode, a busy timeout, `BEGIN IMMEDIATE` for every write (so two writers never
deadlock on a lock upgrade), one connection per thread, and forward-only versioned
migrations. A database written by a newer orchestrator refuses to open. The store owns no
table: each package declares its own (its `schema.py`), put together by
`orchestrator/state_schema.py`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator import metrics

BUSY_TIMEOUT_MS = 10_000

@dataclass(frozen=True)
class Migration:
    """One package's part of the store's migration `version`. The store has one version
    numbering (`PRAGMA user_version`) shared by every package that keeps tables in it; each
    package declares the parts it owns (its `schema.py`), append only: a released migration is
    never edited, and a new one takes the next free version."""

    version: int
    script: str


class MigrationGap(ValueError):
    """The packages' migrations do not number 1..n without a gap."""


def compose_migrations(*parts: Sequence[Migration]) -> tuple[str, ...]:
    """Pure: one script per version (the store's `migrations`), the parts of one version in the
    order given. Versions must run 1..n with none missing."""
    by_version: dict[int, list[str]] = {}
    for migrations in parts:
        for migration in migrations:
            by_version.setdefault(migration.version, []).append(migration.script.strip("\n"))
    missing = sorted(set(range(1, max(by_version, default=0) + 1)) - by_version.keys())
    if missing or any(version < 1 for version in by_version):
        raise MigrationGap(f"migration versions must run 1..n: missing {missing}, found {sorted(by_version)}")
    return tuple("\n".join(by_version[version]) + "\n" for version in sorted(by_version))


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer orchestrator; opening it could corrupt it."""


class StateStore:
    def __init__(self, path: Path, migrations: Sequence[str], *, synchronous: str = "NORMAL") -> None:
        """`migrations`: one script per version, oldest first (`compose_migrations`; the
        orchestrator's state: `orchestrator.state_schema.STATE_MIGRATIONS`)."""
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
