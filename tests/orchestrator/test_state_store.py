from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import SchemaTooNewError, StateStore


def test_new_database_is_wal_and_fully_migrated(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state" / "db.sqlite3", STATE_MIGRATIONS)
    store.open()
    conn = store.connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    assert store.schema_version() == len(STATE_MIGRATIONS)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"users", "group_members", "projects", "sessions", "runs", "audit_log"} <= tables
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    store.close()


def test_forward_migration_applies_only_new_versions(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    first = StateStore(path, migrations=["CREATE TABLE a (x INTEGER);"])
    first.open()
    with first.write() as tx:
        tx.execute("INSERT INTO a VALUES (1)")
    first.close()
    second = StateStore(path, migrations=["CREATE TABLE a (x INTEGER);", "ALTER TABLE a ADD COLUMN y TEXT;"])
    second.open()
    assert second.schema_version() == 2
    with second.read() as tx:
        assert tx.one("SELECT x, y FROM a")[0] == 1
    second.close()


def test_newer_schema_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(STATE_MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(SchemaTooNewError, match="newer orchestrator"):
        StateStore(path, STATE_MIGRATIONS).open()
    # nothing was changed
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(STATE_MIGRATIONS) + 1
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_failed_write_rolls_back(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "db.sqlite3", STATE_MIGRATIONS)
    store.open()
    with pytest.raises(RuntimeError):
        with store.write() as tx:
            tx.execute("INSERT INTO projects (project_id, updated_at) VALUES ('p', 'now')")
            raise RuntimeError("boom")
    with store.read() as tx:
        assert tx.one("SELECT count(*) FROM projects")[0] == 0
    store.close()


def test_concurrent_writers_from_threads_all_commit(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "db.sqlite3", STATE_MIGRATIONS)
    store.open()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(50):
                with store.write() as tx:
                    count = tx.one("SELECT count(*) FROM projects")[0]
                    tx.execute("INSERT INTO projects (project_id, updated_at) VALUES (?, ?)", (f"p{n}-{i}", str(count)))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with store.read() as tx:
        assert tx.one("SELECT count(*) FROM projects")[0] == 400
    store.close()


def test_concurrent_writers_of_one_process_all_commit(tmp_path: Path) -> None:
    # They queue on the store's lock rather than in SQLite's busy handler (its sleeps starved
    # writers: bench/collaboration.py shows the difference); none may be lost or fail.
    store = StateStore(tmp_path / "db.sqlite3", migrations=["CREATE TABLE t (x INTEGER);"], synchronous="FULL")
    store.open()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(20):
                with store.write() as tx:
                    tx.execute("INSERT INTO t VALUES (?)", (n * 100 + i,))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with store.read() as tx:
        assert tx.one("SELECT COUNT(DISTINCT x) FROM t")[0] == 320
    store.close()


def test_a_nested_write_in_one_thread_fails_at_once(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "db.sqlite3", migrations=["CREATE TABLE t (x INTEGER);"])
    store.open()
    with store.write():
        with pytest.raises(sqlite3.OperationalError, match="within a transaction"):
            with store.write():
                pass
    store.close()
