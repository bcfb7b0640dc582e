"""The mailbox file: WAL, synchronous=FULL, schema version, unique keys and
conditional updates."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from orchestrator.collaboration.records import Direction
from orchestrator.collaboration.states import DeliveryState
from orchestrator.collaboration.store import MAILBOX_MIGRATIONS, Mailbox, open_mailbox
from orchestrator.service import OrchestratorService
from orchestrator.state_store import SchemaTooNewError
from tests.conftest import make_settings


def test_the_service_opens_the_mailbox_in_the_data_layout(service: OrchestratorService) -> None:
    path = service.layout.collaboration_db
    assert path == service.layout.state_dir / "collaboration.sqlite3" and path.is_file()
    conn = service.mailbox.connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    assert service.mailbox.schema_version() == len(MAILBOX_MIGRATIONS)
    assert path.stat().st_mode & 0o777 == 0o600
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"scopes", "requests", "messages", "deliveries", "delivery_messages"} <= tables


def test_a_newer_mailbox_refuses_to_open_and_the_service_with_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = data / "state" / "collaboration.sqlite3"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {len(MAILBOX_MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(SchemaTooNewError, match="schema version"):
        open_mailbox(db)
    with pytest.raises(SchemaTooNewError):
        OrchestratorService(make_settings(data))


def _seed_delivery(store) -> str:
    with store.write() as tx:
        tx.execute(
            "INSERT INTO scopes VALUES ('cs-1', 'A', 'r-1', 'active', NULL, 1, 0, 't', 't')"
        )
        tx.execute(
            "INSERT INTO requests (request_id, scope_id, source_session_id, source_run_id, generation,"
            " target_session_id, state, continuation, op_key, body_hash, version, created_at, updated_at)"
            " VALUES ('cr-1', 'cs-1', 'A', 'r-1', 'r-1', 'B', 'pending', 'active', 'k1', 'h', 1, 't', 't')"
        )
        Mailbox.insert_delivery(tx, "cd-1", "B", Direction.WORK, "cr-1", "cs-1")
    return "cd-1"


def test_operation_keys_are_unique_in_the_file(tmp_path: Path) -> None:
    store = open_mailbox(tmp_path / "m.sqlite3")
    _seed_delivery(store)
    with pytest.raises(sqlite3.IntegrityError):
        with store.write() as tx:
            tx.execute(
                "INSERT INTO requests (request_id, scope_id, source_session_id, source_run_id, generation,"
                " target_session_id, state, continuation, op_key, body_hash, version, created_at, updated_at)"
                " VALUES ('cr-2', 'cs-1', 'A', 'r-1', 'r-1', 'B', 'pending', 'active', 'k1', 'h', 1, 't', 't')"
            )
    store.close()


def test_a_message_rides_in_at_most_one_delivery(tmp_path: Path) -> None:
    store = open_mailbox(tmp_path / "m.sqlite3")
    _seed_delivery(store)
    with store.write() as tx:
        Mailbox.insert_delivery(tx, "cd-2", "B", Direction.WORK, "cr-1", "cs-1")
        tx.execute(
            "INSERT INTO messages VALUES ('cm-1', 'cr-1', 1, 'source', 'A', 'r-1', 'request', 'x', 'k1', 'h', 't')"
        )
        Mailbox.attach(tx, "cd-1", "cm-1")
    with pytest.raises(sqlite3.IntegrityError):
        with store.write() as tx:
            Mailbox.attach(tx, "cd-2", "cm-1")
    store.close()


def test_two_connections_racing_to_claim_one_delivery_give_one_winner(tmp_path: Path) -> None:
    """Claims are conditional updates on the row version: stale readers lose, in any thread."""
    path = tmp_path / "m.sqlite3"
    store = open_mailbox(path)
    _seed_delivery(store)
    with store.read() as tx:
        seen = Mailbox.delivery(tx, "cd-1")  # every contender read version 1
    assert seen is not None and seen.state is DeliveryState.PENDING
    barrier = threading.Barrier(8)
    wins: list[bool] = []

    def contend() -> None:
        other = open_mailbox(path)  # its own connection, as another worker would have
        barrier.wait()
        with other.write() as tx:
            wins.append(Mailbox.update_delivery(tx, seen, state=DeliveryState.CLAIMED))
        other.close()

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
    with store.read() as tx:
        final = Mailbox.delivery(tx, "cd-1")
    assert final.state is DeliveryState.CLAIMED and final.version == 2
    store.close()
