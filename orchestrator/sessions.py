"""Sessions: records, the repository, and the service behind the session endpoints."""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import dataclass, replace
from enum import Enum

from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.errors import Conflict, NotFound
from orchestrator.identity import ParentIdentity, inherited_runtime_user
from orchestrator.projects import ProjectRepository
from orchestrator.state_store import StateStore, Transaction
from orchestrator.users import GroupRef, UserRepository


class Channel(str, Enum):
    WEB = "web"
    FEISHU_GROUP = "feishu_group"
    FEISHU_PRIVATE = "feishu_private"
    DINGTALK_GROUP = "dingtalk_group"
    DINGTALK_PRIVATE = "dingtalk_private"
    WECHAT = "wechat"
    SCHEDULED = "scheduled"
    OPENAPI = "openapi"


# Flags a PATCH may change (SPEC §12).
SESSION_FLAGS = ("title", "archived", "pinned", "allow_cross_read", "cross_private")


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    owner_user_id: int
    project_id: str | None
    channel: Channel
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


def _session(row: sqlite3.Row) -> SessionRecord:
    group = None
    if row["group_channel"] is not None:
        group = GroupRef(row["group_channel"], row["group_chat_id"])
    return SessionRecord(
        session_id=row["session_id"],
        owner_user_id=row["owner_user_id"],
        project_id=row["project_id"],
        channel=Channel(row["channel"]),
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
        return _session(row) if row else None

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
                record.channel.value,
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
        """D2: persisted at the start of every run."""
        with self._store.write() as tx:
            tx.execute(
                "UPDATE sessions SET last_runtime_user_id = ? WHERE session_id = ?", (user_id, session_id)
            )

    def list_for_owner(self, owner_user_id: int, project_id: str | None) -> list[SessionRecord]:
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT * FROM sessions WHERE owner_user_id = ? AND project_id IS ? AND deleted_at IS NULL"
                " ORDER BY updated_at DESC",
                (owner_user_id, project_id),
            )
        return [_session(row) for row in rows]


@dataclass(frozen=True)
class NewSession:
    owner_user_id: int
    channel: Channel
    session_id: str | None = None
    project_id: str | None = None
    group: GroupRef | None = None
    parent_session_id: str | None = None
    title: str | None = None


class SessionService:
    def __init__(self, store: StateStore, sessions: SessionRepository, users: UserRepository) -> None:
        self._store = store
        self._sessions = sessions
        self._users = users

    def create(self, new: NewSession, *, actor: str) -> SessionRecord:
        now = now_iso()
        session_id = new.session_id or f"s-{secrets.token_hex(12)}"
        with self._store.write() as tx:
            if self._sessions.get_in(tx, session_id) is not None:
                # A deleted id stays taken forever (SPEC §9).
                raise Conflict(f"session {session_id} already exists", field="session_id")
            last_runtime = None
            if new.parent_session_id is not None:
                parent = self._sessions.get_in(tx, new.parent_session_id)
                if parent is None or parent.deleted:
                    raise NotFound(
                        f"parent session {new.parent_session_id} not found", field="parent_session_id"
                    )
                # seed 002 §5.8: a subagent inherits the parent's runtime identity at spawn.
                last_runtime = inherited_runtime_user(parent.parent_identity)
            UserRepository.ensure(tx, new.owner_user_id)
            if new.project_id is not None:
                ProjectRepository.ensure(tx, new.project_id)
            if new.group is not None:
                UserRepository.add_group_member(tx, new.group, new.owner_user_id)
            record = SessionRecord(
                session_id=session_id,
                owner_user_id=new.owner_user_id,
                project_id=new.project_id,
                channel=new.channel,
                group=new.group,
                parent_session_id=new.parent_session_id,
                title=new.title,
                last_runtime_user_id=last_runtime,
                allow_cross_read=True,
                cross_private=False,
                archived=False,
                pinned=False,
                created_at=now,
                updated_at=now,
            )
            self._sessions.insert(tx, record)
            audit.record(
                tx,
                actor=actor,
                action="session.create",
                session_id=session_id,
                owner_user_id=new.owner_user_id,
                channel=new.channel.value,
                project_id=new.project_id,
            )
        return record

    def get(self, session_id: str, *, acting_user: int | None = None, owner_only: bool = False) -> SessionRecord:
        """A live session as seen by `acting_user` (None: the bot itself, trusted for everyone).

        Not visible looks exactly like not found (SPEC §9): 404, never 403. Group members see
        their group's sessions; only the owner may change or delete one (`owner_only`).
        """
        record = self._sessions.get(session_id)
        if record is None or not self.visible(record, acting_user, owner_only=owner_only):
            raise NotFound(f"session {session_id} not found")
        return record

    def visible(self, record: SessionRecord, acting_user: int | None, *, owner_only: bool = False) -> bool:
        if acting_user is None or acting_user == record.owner_user_id:
            return True
        if owner_only or record.group is None:
            return False
        return self._users.is_group_member(record.group, acting_user)

    def update(self, session_id: str, changes: dict[str, object], *, actor: str) -> SessionRecord:
        with self._store.write() as tx:
            record = self._sessions.get_in(tx, session_id)
            if record is None or record.deleted:
                raise NotFound(f"session {session_id} not found")
            self._sessions.update_flags(tx, session_id, changes)
            audit.record(
                tx,
                actor=actor,
                action="session.update",
                session_id=session_id,
                owner_user_id=record.owner_user_id,
                changes=changes,
            )
            updated = self._sessions.get_in(tx, session_id)
        assert updated is not None
        return updated

    def delete(self, session_id: str, *, actor: str) -> SessionRecord:
        """Tombstone: the session vanishes at once and its id is never reused."""
        with self._store.write() as tx:
            record = self._sessions.get_in(tx, session_id)
            if record is None or record.deleted:
                raise NotFound(f"session {session_id} not found")
            now = now_iso()
            tx.execute("UPDATE sessions SET deleted_at = ?, updated_at = ? WHERE session_id = ?", (now, now, session_id))
            audit.record(
                tx, actor=actor, action="session.delete", session_id=session_id, owner_user_id=record.owner_user_id
            )
        return replace(record, deleted_at=now)
