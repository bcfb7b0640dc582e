"""The mailbox store: `state/collaboration.sqlite3`.

It reuses `StateStore` (WAL, busy timeout, `BEGIN IMMEDIATE`, versioned migrations; an
unknown newer version refuses to open) with its own migrations and `synchronous=FULL`: an
accepted request must survive a power cut, not only a process crash. This module only reads
and writes rows; what a change means is decided in `states.py` and `policy.py`.

Every state change is a conditional update on the row's `version`, so a claim, a stop and a
settle that race each other cannot both win.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchestrator.clock import now_iso
from orchestrator.collaboration.records import Delivery, Direction, Message, MessageKind, Request, Scope, Side
from orchestrator.collaboration.states import ContinuationState, DeliveryState, RequestState
from orchestrator.state_store import StateStore, Transaction

# Append only: a released migration is never edited; the version is its 1-based index.
MAILBOX_MIGRATIONS: tuple[str, ...] = (
    # 1: scopes, requests, messages, deliveries and which messages each delivery carries
    """
    CREATE TABLE scopes (
        scope_id            TEXT PRIMARY KEY,
        source_session_id   TEXT NOT NULL,
        generation          TEXT NOT NULL,
        state               TEXT NOT NULL,
        reason              TEXT,
        version             INTEGER NOT NULL,
        continuation_count  INTEGER NOT NULL DEFAULT 0,
        created_at          TEXT NOT NULL,
        updated_at          TEXT NOT NULL,
        UNIQUE (source_session_id, generation)
    );
    CREATE INDEX scopes_by_session ON scopes (source_session_id, state);
    CREATE TABLE requests (
        seq                  INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id           TEXT NOT NULL UNIQUE,
        scope_id             TEXT NOT NULL REFERENCES scopes (scope_id),
        source_session_id    TEXT NOT NULL,
        source_run_id        TEXT NOT NULL,
        generation           TEXT NOT NULL,
        target_session_id    TEXT NOT NULL,
        state                TEXT NOT NULL,
        reason               TEXT,
        continuation         TEXT NOT NULL,
        continuation_reason  TEXT,
        clarification_count  INTEGER NOT NULL DEFAULT 0,
        progress_count       INTEGER NOT NULL DEFAULT 0,
        op_key               TEXT NOT NULL UNIQUE,
        body_hash            TEXT NOT NULL,
        version              INTEGER NOT NULL,
        created_at           TEXT NOT NULL,
        updated_at           TEXT NOT NULL
    );
    CREATE INDEX requests_by_source ON requests (source_session_id, seq);
    CREATE INDEX requests_by_target ON requests (target_session_id, seq);
    CREATE INDEX requests_by_scope ON requests (scope_id);
    CREATE TABLE messages (
        message_id         TEXT PRIMARY KEY,
        request_id         TEXT NOT NULL REFERENCES requests (request_id),
        seq                INTEGER NOT NULL,
        sender             TEXT NOT NULL,
        sender_session_id  TEXT NOT NULL,
        sender_run_id      TEXT NOT NULL,
        kind               TEXT NOT NULL,
        body               TEXT NOT NULL,
        op_key             TEXT NOT NULL UNIQUE,
        body_hash          TEXT NOT NULL,
        created_at         TEXT NOT NULL,
        UNIQUE (request_id, seq)
    );
    CREATE TABLE deliveries (
        seq               INTEGER PRIMARY KEY AUTOINCREMENT,
        delivery_id       TEXT NOT NULL UNIQUE,
        session_id        TEXT NOT NULL,
        direction         TEXT NOT NULL,
        request_id        TEXT REFERENCES requests (request_id),
        scope_id          TEXT NOT NULL REFERENCES scopes (scope_id),
        state             TEXT NOT NULL,
        reason            TEXT,
        version           INTEGER NOT NULL,
        run_id            TEXT,
        claimed_at        TEXT,
        claim_expires_at  TEXT,
        outcome           TEXT,
        created_at        TEXT NOT NULL,
        updated_at        TEXT NOT NULL
    );
    CREATE INDEX deliveries_by_session ON deliveries (session_id, state, seq);
    CREATE INDEX deliveries_by_request ON deliveries (request_id);
    CREATE INDEX deliveries_in_flight ON deliveries (state) WHERE state IN ('claimed', 'starting', 'linked');
    CREATE TABLE delivery_messages (
        message_id   TEXT PRIMARY KEY REFERENCES messages (message_id),
        delivery_id  TEXT NOT NULL REFERENCES deliveries (delivery_id),
        withdrawn    TEXT
    );
    CREATE INDEX delivery_messages_by_delivery ON delivery_messages (delivery_id);
    """,
)


def open_mailbox(path: Path) -> StateStore:
    store = StateStore(path, migrations=MAILBOX_MIGRATIONS, synchronous="FULL")
    store.open()
    return store


def _scope(row: sqlite3.Row) -> Scope:
    return Scope(
        scope_id=row["scope_id"],
        source_session_id=row["source_session_id"],
        generation=row["generation"],
        state=ContinuationState(row["state"]),
        reason=row["reason"],
        version=row["version"],
        continuation_count=row["continuation_count"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _request(row: sqlite3.Row) -> Request:
    return Request(
        seq=row["seq"],
        request_id=row["request_id"],
        scope_id=row["scope_id"],
        source_session_id=row["source_session_id"],
        source_run_id=row["source_run_id"],
        generation=row["generation"],
        target_session_id=row["target_session_id"],
        state=RequestState(row["state"]),
        reason=row["reason"],
        continuation=ContinuationState(row["continuation"]),
        continuation_reason=row["continuation_reason"],
        clarification_count=row["clarification_count"],
        progress_count=row["progress_count"],
        op_key=row["op_key"],
        body_hash=row["body_hash"],
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _message(row: sqlite3.Row) -> Message:
    return Message(
        message_id=row["message_id"],
        request_id=row["request_id"],
        seq=row["seq"],
        sender=Side(row["sender"]),
        sender_session_id=row["sender_session_id"],
        sender_run_id=row["sender_run_id"],
        kind=MessageKind(row["kind"]),
        body=row["body"],
        op_key=row["op_key"],
        body_hash=row["body_hash"],
        created_at=row["created_at"],
    )


def _delivery(row: sqlite3.Row) -> Delivery:
    return Delivery(
        seq=row["seq"],
        delivery_id=row["delivery_id"],
        session_id=row["session_id"],
        direction=Direction(row["direction"]),
        request_id=row["request_id"],
        scope_id=row["scope_id"],
        state=DeliveryState(row["state"]),
        reason=row["reason"],
        version=row["version"],
        run_id=row["run_id"],
        claimed_at=row["claimed_at"],
        claim_expires_at=row["claim_expires_at"],
        outcome=row["outcome"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _sql_value(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value


def _conditional_update(tx: Transaction, table: str, key: str, key_value: str, version: int, changes: dict[str, Any]) -> bool:
    """Apply `changes` only if the row still has `version`; bump the version. True if it won."""
    columns = ", ".join(f"{name} = ?" for name in changes)
    cursor = tx.execute(
        f"UPDATE {table} SET {columns}, version = version + 1, updated_at = ? WHERE {key} = ? AND version = ?",
        (*(_sql_value(v) for v in changes.values()), now_iso(), key_value, version),
    )
    return cursor.rowcount == 1


class Mailbox:
    """Row access for one transaction at a time (every method takes the transaction)."""

    # scopes -------------------------------------------------------------------------
    @staticmethod
    def insert_scope(tx: Transaction, scope: Scope) -> None:
        tx.execute(
            "INSERT INTO scopes (scope_id, source_session_id, generation, state, reason, version,"
            " continuation_count, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                scope.scope_id, scope.source_session_id, scope.generation, scope.state.value, scope.reason,
                scope.version, scope.continuation_count, scope.created_at, scope.updated_at,
            ),
        )

    @staticmethod
    def scope(tx: Transaction, scope_id: str) -> Scope | None:
        row = tx.one("SELECT * FROM scopes WHERE scope_id = ?", (scope_id,))
        return _scope(row) if row else None

    @staticmethod
    def scope_for(tx: Transaction, source_session_id: str, generation: str) -> Scope | None:
        row = tx.one(
            "SELECT * FROM scopes WHERE source_session_id = ? AND generation = ?", (source_session_id, generation)
        )
        return _scope(row) if row else None

    @staticmethod
    def active_scopes(tx: Transaction, source_session_id: str) -> list[Scope]:
        rows = tx.all("SELECT * FROM scopes WHERE source_session_id = ? AND state = 'active'", (source_session_id,))
        return [_scope(row) for row in rows]

    @staticmethod
    def update_scope(tx: Transaction, scope: Scope, **changes: Any) -> bool:
        return _conditional_update(tx, "scopes", "scope_id", scope.scope_id, scope.version, changes)

    # requests -----------------------------------------------------------------------
    @staticmethod
    def insert_request(tx: Transaction, request: Request) -> None:
        tx.execute(
            "INSERT INTO requests (request_id, scope_id, source_session_id, source_run_id, generation,"
            " target_session_id, state, reason, continuation, continuation_reason, clarification_count,"
            " progress_count, op_key, body_hash, version, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                request.request_id, request.scope_id, request.source_session_id, request.source_run_id,
                request.generation, request.target_session_id, request.state.value, request.reason,
                request.continuation.value, request.continuation_reason, request.clarification_count,
                request.progress_count, request.op_key, request.body_hash, request.version,
                request.created_at, request.updated_at,
            ),
        )

    @staticmethod
    def request(tx: Transaction, request_id: str) -> Request | None:
        row = tx.one("SELECT * FROM requests WHERE request_id = ?", (request_id,))
        return _request(row) if row else None

    @staticmethod
    def request_by_op_key(tx: Transaction, op_key: str) -> Request | None:
        row = tx.one("SELECT * FROM requests WHERE op_key = ?", (op_key,))
        return _request(row) if row else None

    @staticmethod
    def requests_in_scope(tx: Transaction, scope_id: str) -> list[Request]:
        return [_request(r) for r in tx.all("SELECT * FROM requests WHERE scope_id = ? ORDER BY seq", (scope_id,))]

    @staticmethod
    def requests_of_session(tx: Transaction, session_id: str, *, before: int | None, limit: int) -> list[Request]:
        """Requests the session made or received, newest first (a bounded page)."""
        cursor = before if before is not None else 2**62
        rows = tx.all(
            "SELECT * FROM requests WHERE seq < ? AND (source_session_id = ? OR target_session_id = ?)"
            " ORDER BY seq DESC LIMIT ?",
            (cursor, session_id, session_id, limit),
        )
        return [_request(row) for row in rows]

    @staticmethod
    def open_requests_touching(tx: Transaction, session_id: str) -> list[Request]:
        rows = tx.all(
            "SELECT * FROM requests WHERE (source_session_id = ? OR target_session_id = ?)"
            " AND state IN ('pending', 'processing', 'awaiting_input')",
            (session_id, session_id),
        )
        return [_request(row) for row in rows]

    @staticmethod
    def update_request(tx: Transaction, request: Request, **changes: Any) -> bool:
        return _conditional_update(tx, "requests", "request_id", request.request_id, request.version, changes)

    # messages -----------------------------------------------------------------------
    @staticmethod
    def insert_message(tx: Transaction, message: Message) -> None:
        tx.execute(
            "INSERT INTO messages (message_id, request_id, seq, sender, sender_session_id, sender_run_id, kind,"
            " body, op_key, body_hash, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                message.message_id, message.request_id, message.seq, message.sender.value,
                message.sender_session_id, message.sender_run_id, message.kind.value, message.body,
                message.op_key, message.body_hash, message.created_at,
            ),
        )

    @staticmethod
    def message_by_op_key(tx: Transaction, op_key: str) -> Message | None:
        row = tx.one("SELECT * FROM messages WHERE op_key = ?", (op_key,))
        return _message(row) if row else None

    @staticmethod
    def next_message_seq(tx: Transaction, request_id: str) -> int:
        row = tx.one("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE request_id = ?", (request_id,))
        return int(row[0])

    @staticmethod
    def messages_of(tx: Transaction, request_id: str) -> list[Message]:
        rows = tx.all("SELECT * FROM messages WHERE request_id = ? ORDER BY seq", (request_id,))
        return [_message(row) for row in rows]

    # deliveries ---------------------------------------------------------------------
    @staticmethod
    def insert_delivery(tx: Transaction, delivery_id: str, session_id: str, direction: Direction,
                        request_id: str | None, scope_id: str) -> None:
        now = now_iso()
        tx.execute(
            "INSERT INTO deliveries (delivery_id, session_id, direction, request_id, scope_id, state, version,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'pending', 1, ?, ?)",
            (delivery_id, session_id, direction.value, request_id, scope_id, now, now),
        )

    @staticmethod
    def delivery(tx: Transaction, delivery_id: str) -> Delivery | None:
        row = tx.one("SELECT * FROM deliveries WHERE delivery_id = ?", (delivery_id,))
        return _delivery(row) if row else None

    @staticmethod
    def update_delivery(tx: Transaction, delivery: Delivery, **changes: Any) -> bool:
        return _conditional_update(tx, "deliveries", "delivery_id", delivery.delivery_id, delivery.version, changes)

    @staticmethod
    def in_flight(tx: Transaction, session_id: str | None = None) -> list[Delivery]:
        """Deliveries that own their receiving session: claimed, starting or linked."""
        if session_id is None:
            rows = tx.all("SELECT * FROM deliveries WHERE state IN ('claimed', 'starting', 'linked') ORDER BY seq")
        else:
            rows = tx.all(
                "SELECT * FROM deliveries WHERE session_id = ? AND state IN ('claimed', 'starting', 'linked')"
                " ORDER BY seq",
                (session_id,),
            )
        return [_delivery(row) for row in rows]

    @staticmethod
    def pending(tx: Transaction, session_id: str, limit: int) -> list[Delivery]:
        rows = tx.all(
            "SELECT * FROM deliveries WHERE session_id = ? AND state = 'pending' ORDER BY seq LIMIT ?",
            (session_id, limit),
        )
        return [_delivery(row) for row in rows]

    @staticmethod
    def pending_touching(tx: Transaction, session_id: str) -> list[Delivery]:
        """Not-yet-started deliveries to the session, or about requests it made or received."""
        rows = tx.all(
            "SELECT d.* FROM deliveries d LEFT JOIN requests r ON r.request_id = d.request_id"
            " WHERE d.state IN ('pending', 'claimed', 'starting')"
            " AND (d.session_id = ? OR r.source_session_id = ? OR r.target_session_id = ?)",
            (session_id, session_id, session_id),
        )
        return [_delivery(row) for row in rows]

    @staticmethod
    def count_pending_work(tx: Transaction, session_id: str) -> int:
        row = tx.one(
            "SELECT COUNT(*) FROM deliveries WHERE session_id = ? AND direction = 'work' AND state = 'pending'",
            (session_id,),
        )
        return int(row[0])

    @staticmethod
    def pending_work_for(tx: Transaction, request_id: str) -> Delivery | None:
        row = tx.one(
            "SELECT * FROM deliveries WHERE request_id = ? AND direction = 'work' AND state = 'pending'"
            " ORDER BY seq LIMIT 1",
            (request_id,),
        )
        return _delivery(row) if row else None

    @staticmethod
    def unstarted_work_for(tx: Transaction, request_id: str) -> list[Delivery]:
        rows = tx.all(
            "SELECT * FROM deliveries WHERE request_id = ? AND direction = 'work'"
            " AND state IN ('pending', 'claimed', 'starting') ORDER BY seq",
            (request_id,),
        )
        return [_delivery(row) for row in rows]

    @staticmethod
    def pending_continuation_for(tx: Transaction, session_id: str, scope_id: str) -> Delivery | None:
        row = tx.one(
            "SELECT * FROM deliveries WHERE session_id = ? AND scope_id = ? AND direction = 'continuation'"
            " AND state = 'pending' ORDER BY seq DESC LIMIT 1",
            (session_id, scope_id),
        )
        return _delivery(row) if row else None

    @staticmethod
    def deliveries_of_request(tx: Transaction, request_id: str, limit: int = 50) -> list[Delivery]:
        """Work deliveries of the request and continuation deliveries carrying its messages."""
        rows = tx.all(
            "SELECT * FROM deliveries WHERE request_id = ? OR delivery_id IN"
            " (SELECT dm.delivery_id FROM delivery_messages dm JOIN messages m ON m.message_id = dm.message_id"
            "  WHERE m.request_id = ?) ORDER BY seq LIMIT ?",
            (request_id, request_id, limit),
        )
        return [_delivery(row) for row in rows]

    @staticmethod
    def continuations_carrying(tx: Transaction, request_id: str) -> list[Delivery]:
        rows = tx.all(
            "SELECT DISTINCT d.* FROM deliveries d JOIN delivery_messages dm ON dm.delivery_id = d.delivery_id"
            " JOIN messages m ON m.message_id = dm.message_id"
            " WHERE m.request_id = ? AND d.direction = 'continuation' ORDER BY d.seq",
            (request_id,),
        )
        return [_delivery(row) for row in rows]

    # which messages a delivery carries -------------------------------------------------
    @staticmethod
    def attach(tx: Transaction, delivery_id: str, message_id: str) -> None:
        # message_id is the primary key: a message rides in at most one delivery (no duplicate delivery).
        tx.execute("INSERT INTO delivery_messages (message_id, delivery_id) VALUES (?, ?)", (message_id, delivery_id))

    @staticmethod
    def move(tx: Transaction, message_ids: Iterable[str], delivery_id: str) -> None:
        for message_id in message_ids:
            tx.execute("UPDATE delivery_messages SET delivery_id = ? WHERE message_id = ?", (delivery_id, message_id))

    @staticmethod
    def withdraw(tx: Transaction, message_ids: Iterable[str], reason: str) -> None:
        """The message stays linked to the delivery (history) but is no longer carried by it:
        it is stored and shown, never delivered."""
        for message_id in message_ids:
            tx.execute("UPDATE delivery_messages SET withdrawn = ? WHERE message_id = ?", (reason, message_id))

    @staticmethod
    def carried(tx: Transaction, delivery_id: str) -> list[Message]:
        rows = tx.all(
            "SELECT m.* FROM messages m JOIN delivery_messages dm ON dm.message_id = m.message_id"
            " WHERE dm.delivery_id = ? AND dm.withdrawn IS NULL ORDER BY m.created_at, m.seq",
            (delivery_id,),
        )
        return [_message(row) for row in rows]
