"""Users, their display names and backend overrides, and group memberships."""

from __future__ import annotations

from dataclasses import dataclass

from mounts.layout import GroupRef
from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.errors import Conflict
from orchestrator.state_store import StateStore, Transaction
from orchestrator.users.dirs import check_user_id
from orchestrator.users.tombstones import PurgedUsers, purged_error
from mounts.ids import MAX_USER_ID

__all__ = ["KEEP", "GroupRef", "Keep", "UserRecord", "UserRepository"]


class Keep:
    """The backend override stays as it is."""


KEEP = Keep()


@dataclass(frozen=True)
class UserRecord:
    user_id: int
    display_name: str | None
    backend: str | None
    created_at: str
    updated_at: str


def _user(row) -> UserRecord:
    return UserRecord(
        user_id=row["user_id"],
        display_name=row["display_name"],
        backend=row["backend"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class UserRepository:
    def __init__(self, store: StateStore, *, max_user_id: int = MAX_USER_ID) -> None:
        self._store = store
        self.max_user_id = max_user_id
        self.purged = PurgedUsers(store)

    def admit(self, user_id: int, field: str = "user_id") -> int:
        """A 422 (before anything is written) for a user id beyond this instance's ORCH_MAX_USER_ID,
        a 410 for a purged one."""
        return self.purged.refuse(check_user_id(user_id, self.max_user_id, field), field)

    def upsert(self, user_id: int, *, display_name: str | None, backend: str | None | Keep = KEEP) -> UserRecord:
        """Set the display name, and the backend override unless `backend` is KEEP (only the
        admin sets overrides; a bot's PUT must not clear one either)."""
        self.admit(user_id)
        now = now_iso()
        keep = isinstance(backend, Keep)
        with self._store.write() as tx:
            tx.execute(
                "INSERT INTO users (user_id, display_name, backend, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id) DO UPDATE SET"
                " display_name = excluded.display_name,"
                f" backend = {'users.backend' if keep else 'excluded.backend'},"
                " updated_at = excluded.updated_at",
                (user_id, display_name, None if keep else backend, now, now),
            )
            row = tx.one("SELECT * FROM users WHERE user_id = ?", (user_id,))
        return _user(row)

    @staticmethod
    def ensure(tx: Transaction, user_id: int) -> None:
        """The user's row; a purged user's id is refused here too (a write that raced the purge)."""
        if tx.one("SELECT 1 FROM purged_users WHERE user_id = ?", (user_id,)) is not None:
            raise purged_error(user_id)
        now = now_iso()
        tx.execute(
            "INSERT OR IGNORE INTO users (user_id, created_at, updated_at) VALUES (?, ?, ?)",
            (user_id, now, now),
        )

    def get(self, user_id: int) -> UserRecord | None:
        with self._store.read() as tx:
            row = tx.one("SELECT * FROM users WHERE user_id = ?", (user_id,))
        return _user(row) if row else None

    def known_user_ids(self) -> set[int]:
        with self._store.read() as tx:
            return {row["user_id"] for row in tx.all("SELECT user_id FROM users")}

    @staticmethod
    def add_group_member(tx: Transaction, group: GroupRef, user_id: int) -> bool:
        """Returns True when the user was not a member before."""
        cursor = tx.execute(
            "INSERT OR IGNORE INTO group_members (channel, chat_id, user_id, joined_at) VALUES (?, ?, ?, ?)",
            (group.channel, group.chat_id, user_id, now_iso()),
        )
        return cursor.rowcount == 1

    def remove_group_member(self, group: GroupRef, user_id: int, *, actor: str) -> bool:
        """Revoke a membership; False when there was none. The group's gid stays the group's
        (its files carry it). Refused (409) while the user owns live sessions of the group:
        those sessions would lose their own workspace."""
        with self._store.write() as tx:
            owned = tx.one(
                "SELECT session_id FROM sessions WHERE group_channel = ? AND group_chat_id = ?"
                " AND owner_user_id = ? AND deleted_at IS NULL LIMIT 1",
                (group.channel, group.chat_id, user_id),
            )
            if owned is not None:
                raise Conflict(
                    f"user {user_id} owns session {owned['session_id']} of this group; delete it first",
                    field="user_id",
                )
            cursor = tx.execute(
                "DELETE FROM group_members WHERE channel = ? AND chat_id = ? AND user_id = ?",
                (group.channel, group.chat_id, user_id),
            )
            removed = cursor.rowcount == 1
            if removed:
                audit.record(
                    tx, actor=actor, action="group.member_remove", runtime_user_id=user_id,
                    channel=group.channel, chat_id=group.chat_id,
                )  # fmt: skip
        return removed

    def groups_of(self, user_id: int) -> list[GroupRef]:
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT channel, chat_id FROM group_members WHERE user_id = ? ORDER BY channel, chat_id",
                (user_id,),
            )
        return [GroupRef(row["channel"], row["chat_id"]) for row in rows]

    def is_group_member(self, group: GroupRef, user_id: int) -> bool:
        with self._store.read() as tx:
            return self.is_group_member_in(tx, group, user_id)

    @staticmethod
    def is_group_member_in(tx: Transaction, group: GroupRef, user_id: int) -> bool:
        row = tx.one(
            "SELECT 1 FROM group_members WHERE channel = ? AND chat_id = ? AND user_id = ?",
            (group.channel, group.chat_id, user_id),
        )
        return row is not None
