"""Sessions: records, the repository, and the service behind the session endpoints."""

from __future__ import annotations

import logging
import secrets
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

from mounts.layout import DataLayout
from orchestrator import audit
from orchestrator.sessions.chat_records import ChatMessage, NewMessage
from orchestrator.sessions.chat_store import AppendResult, ChatKey, ChatStore
from orchestrator.clock import now_iso
from orchestrator.errors import CleanupPending, Conflict, Forbidden, InvalidInput, NotFound
from orchestrator.identity import inherited_runtime_user
from orchestrator.log import kv
from orchestrator.sessions.projects import ProjectRepository
from orchestrator.sessions.cleanup import (
    CleanupAction,
    CleanupStep,
    CleanupFailed,
    CleanupPhase,
    DeletedSession,
    SessionCleanup,
    chat_records_step,
    runtime_dirs_step,
)
from orchestrator.state_store import StateStore
from orchestrator.users.repository import GroupRef, UserRepository
from orchestrator.sessions.records import SessionRecord, SessionRepository, channel_problem
from orchestrator.sessions.visibility import cleanup_pending, may_see, read_visible, session_not_found

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionListRequest:
    """`GET /v1/sessions`: whose sessions, in which scope, asked by whom (None: the bot)."""

    owner_user_id: int | None
    project_id: str | None
    acting_user: int | None


@dataclass(frozen=True)
class SessionListing:
    owner_user_id: int
    project_id: str | None
    sessions: tuple[SessionRecord, ...]


@dataclass(frozen=True)
class NewSession:
    owner_user_id: int
    channel: str
    session_id: str | None = None
    project_id: str | None = None
    group: GroupRef | None = None
    parent_session_id: str | None = None
    title: str | None = None



class SessionService:
    """The session endpoints' rules: who may see what, records, deletion.

    Every method that takes `acting_user` decides visibility from the index row alone,
    before any chat record is opened: not visible looks exactly like not found (404).
    """

    def __init__(
        self,
        store: StateStore,
        sessions: SessionRepository,
        users: UserRepository,
        *,
        chat: ChatStore,
        layout: DataLayout,
        cleanup_steps: Sequence[CleanupStep] = (),
    ) -> None:
        """`cleanup_steps`: the other parts' steps of every session deletion, after the built-in
        ones of their phase (see `register_cleanup_step`)."""
        self._store = store
        self._sessions = sessions
        self._users = users
        self._chat = chat
        self.cleanup = SessionCleanup([chat_records_step(chat), runtime_dirs_step(layout), *cleanup_steps])
        self._cleanup_locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
        self._cleanup_locks_guard = threading.Lock()

    @property
    def chat(self) -> ChatStore:
        return self._chat

    def register_cleanup_step(
        self, name: str, action: CleanupAction, *, phase: CleanupPhase = CleanupPhase.REMOVE
    ) -> None:
        """Add an idempotent step to every session deletion (see `SessionCleanup.register`).

        For example the collaboration mailbox registers one that drops the deleted session's
        requests and deliveries: `sessions.register_cleanup_step("mailbox", mailbox.forget)`,
        where `forget(deleted: DeletedSession) -> None`. STOP steps run before any data is
        removed (ending running runs is one); REMOVE steps run after the chat records and
        runtime directories are gone.
        """
        self.cleanup.register(name, action, phase=phase)

    # create, read, list -------------------------------------------------------------------
    def create(self, new: NewSession, *, actor: str, acting_user: int | None = None) -> SessionRecord:
        """A new session. With `acting_user`, only for that user, and only as the child of a
        parent session that user can see (an invisible parent is "not found", like a missing one)."""
        self._users.admit(new.owner_user_id, "owner_user_id")
        problem = channel_problem(new.channel, new.group)
        if problem is not None:
            raise InvalidInput(problem, field="group")
        now = now_iso()
        session_id = new.session_id or f"s-{secrets.token_hex(12)}"
        if acting_user is not None:
            if acting_user != new.owner_user_id:
                # Naming another user than the acting one is "may not", like every users/{uid}
                # route (orchestrator/http/acting.py), not a malformed request.
                raise Forbidden(
                    "a session is created for the acting user (X-Acting-User) only", field="owner_user_id"
                )
            if new.parent_session_id is not None:
                parent = self._sessions.get(new.parent_session_id)
                if parent is None or not self.visible(parent, acting_user):
                    raise NotFound(f"parent session {new.parent_session_id} not found", field="parent_session_id")
        with self._store.write() as tx:
            if self._sessions.get_in(tx, session_id) is not None:
                # A deleted id stays taken forever.
                raise Conflict(f"session {session_id} already exists", field="session_id")
            last_runtime = None
            if new.parent_session_id is not None:
                parent = self._sessions.get_in(tx, new.parent_session_id)
                if parent is None or parent.deleted:
                    raise NotFound(
                        f"parent session {new.parent_session_id} not found", field="parent_session_id"
                    )
                # A subagent inherits the parent's runtime identity at spawn.
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
                channel=new.channel,
                project_id=new.project_id,
            )
            # Inside the transaction: if the chat directory cannot be made (a planted symlink),
            # the session does not come into existence either.
            self._chat.init(ChatKey.of(record))
        return record

    def create_or_get(self, new: NewSession, *, actor: str, acting_user: int | None = None) -> tuple[SessionRecord, bool]:
        """`create`, or the live session that already has `new.session_id` and the same owner,
        channel, group, project and parent (False: not created), so a bot that keys a chat's
        session by its own id can send each message's create without making two. A deleted id,
        one the acting user cannot see, or other attributes stay a conflict."""
        try:
            return self.create(new, actor=actor, acting_user=acting_user), True
        except Conflict:
            existing = self._sessions.get(new.session_id) if new.session_id is not None else None
            if existing is None or not self.visible(existing, acting_user):
                raise
            differs = [
                name
                for name, value in (
                    ("owner_user_id", new.owner_user_id), ("channel", new.channel), ("group", new.group),
                    ("project_id", new.project_id), ("parent_session_id", new.parent_session_id),
                )
                if getattr(existing, name) != value
            ]
            if differs:
                raise Conflict(
                    f"session {new.session_id} already exists with another {', '.join(differs)}", field=differs[0]
                ) from None
            return existing, False

    def list_for_group(self, group: GroupRef, acting_user: int | None) -> list[SessionRecord]:
        """The group chat's live sessions the acting user can see (its members see all), newest first."""
        if acting_user is not None and not self._users.is_group_member(group, acting_user):
            return []
        return self._sessions.list_for_group(group)

    def get(self, session_id: str, *, acting_user: int | None = None, owner_only: bool = False) -> SessionRecord:
        """A live session as seen by `acting_user` (the rule: `sessions/visibility.py`)."""
        with self._store.read() as tx:
            return read_visible(tx, session_id, acting_user, owner_only=owner_only)

    def visible(self, record: SessionRecord, acting_user: int | None, *, owner_only: bool = False) -> bool:
        return may_see(record, acting_user, self._users.is_group_member, owner_only=owner_only)

    def list(self, request: SessionListRequest) -> SessionListing:
        """The live sessions of one owner in one scope (personal when `project_id` is None),
        newest first. With an acting user the owner is that user, and asking for another owner
        lists nothing (it looks like an owner without sessions)."""
        owner = request.acting_user if request.acting_user is not None else request.owner_user_id
        if owner is None:
            raise InvalidInput("owner_user_id (or X-Acting-User) is required", field="owner_user_id")
        mine = request.owner_user_id in (None, owner)
        records = self._sessions.list_for_owner(owner, request.project_id) if mine else []
        return SessionListing(owner_user_id=owner, project_id=request.project_id, sessions=tuple(records))

    def update(self, session_id: str, changes: dict[str, object], *, actor: str) -> SessionRecord:
        with self._store.write() as tx:
            record = self._sessions.get_in(tx, session_id)
            if record is None or record.deleted:
                raise session_not_found(session_id)
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

    # chat records -------------------------------------------------------------------------
    def append_messages(
        self, session_id: str, messages: Sequence[NewMessage], *, acting_user: int | None = None
    ) -> AppendResult:
        record = self.get(session_id, acting_user=acting_user)
        result = self._chat.append(ChatKey.of(record), messages, at=now_iso())
        with self._store.write() as tx:
            self._sessions.touch(tx, session_id)
        return result

    def messages(
        self, session_id: str, *, acting_user: int | None = None, last: int | None = None
    ) -> tuple[list[ChatMessage], int]:
        """The last `last` messages (all when None) and the total count."""
        record = self.get(session_id, acting_user=acting_user)
        return self._chat.message_window(ChatKey.of(record), last)

    # deletion -------------------------------------------------------------------------------
    def delete(self, session_id: str, *, acting_user: int | None = None, actor: str) -> SessionRecord:
        """Tombstone first, then clean up; repeating the call continues an unfinished cleanup.

        The index row is marked deleted in one transaction (the session vanishes from lists,
        reads, search and tools at once, and its id stays taken), then `chat/deleted.json` is
        written, then every cleanup step runs. If anything fails, or the process dies, the
        session stays hidden and the cleanup pending: `CleanupPending` (503) tells the caller
        to repeat the DELETE, which runs every (idempotent) step again.
        """
        with self._store.write() as tx:
            record = self._sessions.get_in(tx, session_id)
            if (
                record is None
                or record.cleanup_done_at is not None
                or not self.visible(record, acting_user, owner_only=True)
            ):
                raise session_not_found(session_id)
            if not record.deleted:
                deleted_at = now_iso()
                tx.execute(
                    "UPDATE sessions SET deleted_at = ?, updated_at = ? WHERE session_id = ?",
                    (deleted_at, deleted_at, session_id),
                )
                audit.record(
                    tx, actor=actor, action="session.delete", session_id=session_id, owner_user_id=record.owner_user_id
                )
                record = replace(record, deleted_at=deleted_at, updated_at=deleted_at)
            runtime_users = self._sessions.runtime_user_ids(tx, session_id)
        return self._finish_cleanup(record, runtime_users, actor=actor)

    def finish_pending_cleanups(self, *, actor: str) -> tuple[list[str], list[str]]:
        """Continue every unfinished cleanup (at start-up); returns (finished, still pending)."""
        finished, pending = [], []
        for record in self._sessions.pending_cleanups():
            with self._store.read() as tx:
                runtime_users = self._sessions.runtime_user_ids(tx, record.session_id)
            try:
                self._finish_cleanup(record, runtime_users, actor=actor)
                finished.append(record.session_id)
            except CleanupPending:
                pending.append(record.session_id)
        return finished, pending

    def _cleanup_lock(self, session_id: str) -> threading.Lock:
        with self._cleanup_locks_guard:
            lock = self._cleanup_locks.get(session_id)
            if lock is None:
                lock = threading.Lock()
                self._cleanup_locks[session_id] = lock
        return lock

    def _finish_cleanup(self, record: SessionRecord, runtime_users: Sequence[int], *, actor: str) -> SessionRecord:
        assert record.deleted_at is not None
        deleted = DeletedSession(
            session_id=record.session_id,
            owner_user_id=record.owner_user_id,
            project_id=record.project_id,
            group=record.group,
            deleted_at=record.deleted_at,
            runtime_user_ids=tuple(sorted({*runtime_users, record.owner_user_id})),
        )
        fields = {"session": record.session_id, "owner": record.owner_user_id}
        with self._cleanup_lock(record.session_id):
            try:
                self._chat.mark_deleted(deleted.chat_key, deleted_at=record.deleted_at, actor=actor)
                self.cleanup.run(deleted)
            except Exception as exc:
                step = exc.step if isinstance(exc, CleanupFailed) else "tombstone_file"
                cause = exc.cause if isinstance(exc, CleanupFailed) else exc
                log.warning("session cleanup unfinished %s", kv(**fields, step=step, error=cause))
                raise cleanup_pending(
                    record.session_id, f"step {step} failed ({cause}); repeat DELETE to continue it", step=step
                ) from exc
            done_at = now_iso()
            with self._store.write() as tx:
                cursor = tx.execute(
                    "UPDATE sessions SET cleanup_done_at = ? WHERE session_id = ? AND cleanup_done_at IS NULL",
                    (done_at, record.session_id),
                )
                if cursor.rowcount == 1:
                    audit.record(
                        tx,
                        actor=actor,
                        action="session.cleanup_done",
                        session_id=record.session_id,
                        owner_user_id=record.owner_user_id,
                        runtime_user_ids=list(deleted.runtime_user_ids),
                    )
        log.info("session deleted and cleaned up %s", kv(**fields, runtime_users=",".join(map(str, deleted.runtime_user_ids))))
        return replace(record, cleanup_done_at=done_at)

