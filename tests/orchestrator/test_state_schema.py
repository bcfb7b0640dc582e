"""Each package owns its tables and migrations (its `schema.py`); `orchestrator/state_schema.py`
puts them together under the store's one version numbering. A data dir migrated by the
released migrations (one tuple in `state_store.py` until the split) opens and keeps working,
and each version's schema is the one it was."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import Migration, MigrationGap, _split_statements, compose_migrations
from tests.conftest import ADMIN_TOKEN, API_TOKEN, make_settings
from tests.orchestrator.released_state_migrations import RELEASED_MIGRATIONS

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _migrated(path: Path, migrations: tuple[str, ...], upto: int) -> sqlite3.Connection:
    """A database migrated the way StateStore does: each version's script, then user_version."""
    conn = sqlite3.connect(path, isolation_level=None)
    for version in range(1, upto + 1):
        for statement in _split_statements(migrations[version - 1]):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
    return conn


def _schema(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    return sorted((kind, name, re.sub(r"\s+", " ", sql or "").strip()) for kind, name, sql in rows)


def test_the_packages_migrations_number_as_released() -> None:
    assert len(STATE_MIGRATIONS) == len(RELEASED_MIGRATIONS)


@pytest.mark.parametrize("version", range(1, len(RELEASED_MIGRATIONS) + 1))
def test_each_version_has_the_schema_it_was_released_with(tmp_path: Path, version: int) -> None:
    released = _migrated(tmp_path / "released.db", RELEASED_MIGRATIONS, version)
    composed = _migrated(tmp_path / "composed.db", STATE_MIGRATIONS, version)
    assert _schema(composed) == _schema(released)


def test_a_data_dir_half_migrated_by_the_released_code_ends_where_a_new_one_does(tmp_path: Path) -> None:
    conn = _migrated(tmp_path / "old.db", RELEASED_MIGRATIONS, 6)
    for version in range(7, len(STATE_MIGRATIONS) + 1):
        for statement in _split_statements(STATE_MIGRATIONS[version - 1]):
            conn.execute(statement)
    fresh = _migrated(tmp_path / "new.db", STATE_MIGRATIONS, len(STATE_MIGRATIONS))
    assert _schema(conn) == _schema(fresh)


def test_a_data_dir_migrated_by_the_released_code_opens_and_keeps_working(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir)
    # First start with the released schema: a user with a name, a published upload and egress
    # rules (rows of three packages a purge deletes in its tombstone), then a restart.
    service = OrchestratorService(settings)
    db = service.layout.state_db
    service.close()
    db.unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    conn = _migrated(db, RELEASED_MIGRATIONS, len(RELEASED_MIGRATIONS))
    now = "2026-01-01T00:00:00Z"
    conn.execute("INSERT INTO users VALUES (41, 'Ada', NULL, ?, ?)", (now, now))
    conn.execute("INSERT INTO published_uploads VALUES (41, 'a.png', ?)", (now,))
    conn.execute("INSERT INTO runtime_overrides VALUES ('egress_rules:41', '{\"allow\": [], \"remove\": []}', 'admin', ?)", (now,))
    conn.close()

    service = OrchestratorService(settings)
    try:
        assert service.store.schema_version() == len(RELEASED_MIGRATIONS)  # nothing to migrate
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            assert client.get("/v1/users/41").json()["display_name"] == "Ada"
            session = client.post("/v1/sessions", json={"owner_user_id": 41, "channel": "feishu_dm"})
            assert session.status_code == 201, session.text
            run = client.post(f"/v1/sessions/{session.json()['session_id']}/runs", json={"trigger": "private_message", "speaker_user_id": 41})
            assert run.status_code == 201, run.text
            purge = client.request("DELETE", "/v1/admin/users/41", json={"confirm_user_id": 41}, headers=ADMIN)
            assert purge.status_code == 200, purge.text
        with service.store.read() as tx:
            assert tx.one("SELECT 1 FROM published_uploads WHERE owner_user_id = 41") is None
            assert tx.one("SELECT 1 FROM runtime_overrides WHERE key = 'egress_rules:41'") is None
            assert tx.one("SELECT display_name FROM users WHERE user_id = 41")["display_name"] is None
            assert tx.one("SELECT 1 FROM session_runtime_users WHERE user_id = 41") is not None
    finally:
        service.close()


def test_composing_refuses_a_gap_in_the_numbering() -> None:
    with pytest.raises(MigrationGap, match=r"missing \[2\]"):
        compose_migrations([Migration(1, "CREATE TABLE a (x);")], [Migration(3, "CREATE TABLE b (x);")])


def test_composing_puts_one_versions_parts_in_the_order_of_the_packages() -> None:
    first, second = [Migration(1, "CREATE TABLE a (x);")], [Migration(1, "CREATE TABLE b (x);"), Migration(2, "CREATE TABLE c (x);")]
    assert compose_migrations(first, second) == ("CREATE TABLE a (x);\nCREATE TABLE b (x);\n", "CREATE TABLE c (x);\n")
