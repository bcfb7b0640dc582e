"""A session's record and its repository: the rows of `sessions`, read and written inside a state-store transaction."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from orchestrator.clock import now_iso
from orchestrator.identity import ParentIdentity
from orchestrator.state_store import StateStore, Transaction
from orchestrator.users.repository import GroupRef

# A session's channel is any platform name (`mounts.ids.platform`): `web`, `slack`,
# `feishu_group`, a company's own. The entry point's behaviour follows the run's trigger, not
# the channel. One rule only: a channel named `*_group` is a group chat's, and its session names
# the group (its workspace, its uploads) from the start.
GROUP_CHANNEL_SUFFIX = "_group"


def channel_problem(channel: str, group: GroupRef | None) -> str | None:
    """Pure: why a session of `channel` with `group` cannot be created, or None."""
    if channel.endswith(GROUP_CHANNEL_SUFFIX) and group is None:
        return (
            f"a {channel} session is a group chat's: send its group ({{\"channel\", \"chat_id\"}}) so that its"
            " workspace and group uploads exist from the first run"
        )
    return None


# A group chat's sessions one lookup returns at most (newest first).
GROUP_SESSIONS_MAX = 100

# Flags a PATCH may change.
SESSION_FLAGS = ("title", "archived", "pinned", "allow_cross_read", "cross_private")


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    owner_user_id: int
    project_id: str | None
    channel: str
    group: GroupRef | None
    parent_session_id: str | None
    title: str | None
    last_runtime_user_id: int | None
    allow_cross_read: bool
    cross_private: bool
    archived: bool
    pinned: bool
    created_at: str
    updated_at: str
    deleted_at: str | None = None
    cleanup_done_at: str | None = None

    @property
    def deleted(self) -> bool:
        return self.deleted_at is not None

    @property
    def parent_identity(self) -> ParentIdentity:
        return ParentIdentity(owner_user_id=self.owner_user_id, last_runtime_user_id=self.last_runtime_user_id)


def session_from_row(row: sqlite3.Row) -> SessionRecord:
    group = None
    if row["group_channel"] is not None:
        group = GroupRef(row["group_channel"], row["group_chat_id"])
    return SessionRecord(
        session_id=row["session_id"],
        owner_user_id=row["owner_user_id"],
        project_id=row["project_id"],
        channel=row["channel"],
        group=group,
        parent_session_id=row["parent_session_id"],
        title=row["title"],
        last_runtime_user_id=row["last_runtime_user_id"],
        allow_cross_read=bool(row["allow_cross_read"]),
        cross_private=bool(row["cross_private"]),
        archived=bool(row["archived"]),
        pinned=bool(row["pinned"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        deleted_at=row["deleted_at"],
        cleanup_done_at=row["cleanup_done_at"],
    )


class SessionRepository:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    @staticmethod
    def get_in(tx: Transaction, session_id: str) -> SessionRecord | None:
        """The session row, deleted or not."""
        row = tx.one("SELECT * FROM sessions WHERE session_id = ?", (session_id,))
        return session_from_row(row) if row else None

    def get(self, session_id: str) -> SessionRecord | None:
        """A live (not deleted) session."""
        with self._store.read() as tx:
            record = self.get_in(tx, session_id)
        return record if record is not None and not record.deleted else None

    def get_any(self, session_id: str) -> SessionRecord | None:
        with self._store.read() as tx:
            return self.get_in(tx, session_id)

    @staticmethod
    def insert(tx: Transaction, record: SessionRecord) -> None:
        tx.execute(
            "INSERT INTO sessions (session_id, owner_user_id, project_id, channel, group_channel,"
            " group_chat_id, parent_session_id, title, last_runtime_user_id, allow_cross_read,"
            " cross_private, archived, pinned, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.session_id,
                record.owner_user_id,
                record.project_id,
                record.channel,
                record.group.channel if record.group else None,
                record.group.chat_id if record.group else None,
                record.parent_session_id,
                record.title,
                record.last_runtime_user_id,
                int(record.allow_cross_read),
                int(record.cross_private),
                int(record.archived),
                int(record.pinned),
                record.created_at,
                record.updated_at,
            ),
        )

    @staticmethod
    def update_flags(tx: Transaction, session_id: str, changes: dict[str, object]) -> None:
        unknown = set(changes) - set(SESSION_FLAGS)
        if unknown:
            raise ValueError(f"not session flags: {sorted(unknown)}")
        if not changes:
            return
        columns = ", ".join(f"{name} = ?" for name in changes)
        values = [int(v) if isinstance(v, bool) else v for v in changes.values()]
        tx.execute(
            f"UPDATE sessions SET {columns}, updated_at = ? WHERE session_id = ?",
            (*values, now_iso(), session_id),
        )

    def set_last_runtime_user(self, session_id: str, user_id: int) -> None:
        """Persisted at the start of every run; a failed write does not block the run."""
        with self._store.write() as tx:
            tx.execute(
                "UPDATE sessions SET last_runtime_user_id = ? WHERE session_id = ?", (user_id, session_id)
            )

    @staticmethod
    def touch(tx: Transaction, session_id: str) -> bool:
        """Bump `updated_at` of a live session; False when it is (now) deleted."""
        cursor = tx.execute(
            "UPDATE sessions SET updated_at = ? WHERE session_id = ? AND deleted_at IS NULL", (now_iso(), session_id)
        )
        return cursor.rowcount == 1

    @staticmethod
    def add_runtime_user(tx: Transaction, session_id: str, user_id: int, *, at: str) -> None:
        """Remember that `user_id` ran in the session (its runtime dirs go with the session)."""
        tx.execute(
            "INSERT OR IGNORE INTO session_runtime_users (session_id, user_id, first_at) VALUES (?, ?, ?)",
            (session_id, user_id, at),
        )

    @staticmethod
    def runtime_user_ids(tx: Transaction, session_id: str) -> list[int]:
        rows = tx.all("SELECT user_id FROM session_runtime_users WHERE session_id = ? ORDER BY user_id", (session_id,))
        return [row["user_id"] for row in rows]

    def pending_cleanups(self) -> list[SessionRecord]:
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT * FROM sessions WHERE deleted_at IS NOT NULL AND cleanup_done_at IS NULL ORDER BY deleted_at"
            )
        return [session_from_row(row) for row in rows]

    def list_for_owner(self, owner_user_id: int, project_id: str | None) -> list[SessionRecord]:
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT * FROM sessions WHERE owner_user_id = ? AND project_id IS ? AND deleted_at IS NULL"
                " ORDER BY updated_at DESC",
                (owner_user_id, project_id),
            )
        return [session_from_row(row) for row in rows]

    def latest_of_owner(self, owner_user_id: int, *, limit: int) -> list[SessionRecord]:
        """The owner's sessions in every project, deleted ones too, newest first (the admin's view)."""
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT * FROM sessions WHERE owner_user_id = ? ORDER BY updated_at DESC LIMIT ?", (owner_user_id, limit)
            )
        return [session_from_row(row) for row in rows]

    def list_for_group(self, group: GroupRef) -> list[SessionRecord]:
        """A group chat's live sessions, whoever owns them, newest first."""
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT * FROM sessions WHERE group_channel = ? AND group_chat_id = ? AND deleted_at IS NULL"
                " ORDER BY updated_at DESC LIMIT ?",
                (group.channel, group.chat_id, GROUP_SESSIONS_MAX),
            )
        return [session_from_row(row) for row in rows]
