"""The rows of `previews` (state DB): one per preview link, read by id and by token."""

from __future__ import annotations

import uuid
from datetime import datetime

from orchestrator.clock import iso
from orchestrator.previews.model import PreviewRecord, new_token
from orchestrator.state_store import StateStore, Transaction

_COLUMNS = "preview_id, token, user_id, run_id, session_id, port, created_at, expires_at"


def _record(row: object) -> PreviewRecord:
    return PreviewRecord(**{key: row[key] for key in _COLUMNS.split(", ")})  # type: ignore[index]


class PreviewStore:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    def create(self, tx: Transaction, *, user_id: int, run_id: str, session_id: str, port: int, now: datetime,
               expires: datetime) -> PreviewRecord:  # fmt: skip
        # Expired links are of no use to anyone: dropped as new ones are made (indexed).
        tx.execute("DELETE FROM previews WHERE expires_at <= ?", (iso(now),))
        record = PreviewRecord(
            preview_id=f"pv_{uuid.uuid4().hex}",
            token=new_token(),
            user_id=user_id, run_id=run_id, session_id=session_id, port=port,
            created_at=iso(now), expires_at=iso(expires),
        )  # fmt: skip
        tx.execute(
            f"INSERT INTO previews ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (record.preview_id, record.token, user_id, run_id, session_id, port, record.created_at, record.expires_at),
        )
        return record

    def get(self, preview_id: str) -> PreviewRecord | None:
        with self._store.read() as tx:
            row = tx.one(f"SELECT {_COLUMNS} FROM previews WHERE preview_id = ?", (preview_id,))
        return _record(row) if row is not None else None

    def by_token(self, token: str) -> PreviewRecord | None:
        with self._store.read() as tx:
            row = tx.one(f"SELECT {_COLUMNS} FROM previews WHERE token = ?", (token,))
        return _record(row) if row is not None else None

    def live_for_run(self, run_id: str, now: datetime) -> list[PreviewRecord]:
        with self._store.read() as tx:
            rows = tx.all(
                f"SELECT {_COLUMNS} FROM previews WHERE run_id = ? AND expires_at > ? ORDER BY created_at",
                (run_id, iso(now)),
            )
        return [_record(row) for row in rows]

    def ids_of_user(self, user_id: int) -> list[str]:
        """Every preview of the user, live or expired (a purge ends them all)."""
        with self._store.read() as tx:
            rows = tx.all("SELECT preview_id FROM previews WHERE user_id = ? ORDER BY created_at", (user_id,))
        return [row["preview_id"] for row in rows]

    def delete(self, tx: Transaction, preview_id: str) -> bool:
        return tx.execute("DELETE FROM previews WHERE preview_id = ?", (preview_id,)).rowcount > 0
