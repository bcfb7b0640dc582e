"""Who sees a session: the rule, and reading a session the way someone sees it.

`acting_user` None is the bot itself, trusted for everyone. Otherwise the owner sees its
sessions and group members their group's; only the owner may change or delete one
(`owner_only`). Not visible looks exactly like not found (404, never 403). A deleted session
whose cleanup is unfinished is 503 `session_cleanup_pending` for its owner (so the client knows
to repeat the DELETE) and 404 for everybody else.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from orchestrator.errors import CleanupPending, NotFound
from orchestrator.sessions.records import SessionRecord, SessionRepository
from orchestrator.state_store import Transaction
from orchestrator.users.repository import GroupRef, UserRepository

IsMember = Callable[[GroupRef, int], bool]


class Sight(str, Enum):
    VISIBLE = "visible"
    HIDDEN = "hidden"  # unknown, deleted, or not this person's: all answer "not found"
    CLEANUP_PENDING = "cleanup_pending"  # deleted, cleanup unfinished, asked by its owner


def may_see(record: SessionRecord, acting_user: int | None, is_member: IsMember, *, owner_only: bool = False) -> bool:
    """Pure but for `is_member`, which is asked only for a group session and a non-owner."""
    if acting_user is None or acting_user == record.owner_user_id:
        return True
    if owner_only or record.group is None:
        return False
    return is_member(record.group, acting_user)


def sight(
    record: SessionRecord | None, acting_user: int | None, is_member: IsMember, *, owner_only: bool = False
) -> Sight:
    if record is None:
        return Sight.HIDDEN
    if record.deleted:
        if record.cleanup_done_at is None and may_see(record, acting_user, is_member, owner_only=True):
            return Sight.CLEANUP_PENDING
        return Sight.HIDDEN
    return Sight.VISIBLE if may_see(record, acting_user, is_member, owner_only=owner_only) else Sight.HIDDEN


def read_visible(
    tx: Transaction, session_id: str, acting_user: int | None, *, owner_only: bool = False
) -> SessionRecord:
    """The live session as `acting_user` sees it, read (with the membership) in `tx`; else the
    NotFound or CleanupPending that person gets."""
    record = SessionRepository.get_in(tx, session_id)
    seen = sight(record, acting_user, lambda group, user: UserRepository.is_group_member_in(tx, group, user), owner_only=owner_only)
    if seen is Sight.CLEANUP_PENDING:
        raise cleanup_pending(session_id, "repeat DELETE to finish it")
    if seen is Sight.HIDDEN:
        raise session_not_found(session_id)
    assert record is not None
    return record


def session_not_found(session_id: str) -> NotFound:
    # One message for unknown, deleted, and not visible: they must be indistinguishable.
    return NotFound(f"session {session_id} not found")


def cleanup_pending(session_id: str, what_next: str, **details: object) -> CleanupPending:
    return CleanupPending(
        f"session {session_id} is deleted but its cleanup is unfinished: {what_next}",
        session_id=session_id,
        **details,
    )
