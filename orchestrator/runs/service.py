"""Runs: resolving the identities of a run, persisting them, and building its context (SPEC §3, §7)."""

from __future__ import annotations

import logging
import secrets
import sqlite3
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import Enum

from mounts import ids
from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.errors import Conflict, InvalidInput, NotFound
from orchestrator.identity import (
    SPEAKER_TRIGGERS,
    IdentityInputError,
    RunIdentity,
    Trigger,
    inherited_runtime_user,
    resolve_run_identity,
)
from orchestrator.runs.identity_switch import RuntimeIdentitySwitch
from orchestrator.log import kv, run_logger
from orchestrator.runs.prompt_identity import IdentityPromptFacts, render_identity_section
from orchestrator.sessions.cleanup import DeletedSession
from orchestrator.sessions.service import SessionRecord, SessionRepository
from orchestrator.settings import IdentityMode, Settings
from orchestrator.skills_port import RunSkills, SkillProvider
from orchestrator.state_store import StateStore, Transaction
from orchestrator.users.dirs import UserDirectories
from orchestrator.users.repository import UserRepository

log = logging.getLogger(__name__)


class RunStatus(str, Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    session_id: str
    trigger: Trigger
    agent_id: str
    identity_mode: IdentityMode
    owner_user_id: int
    execution_user_id: int | None
    runtime_user_id: int
    speaker_user_id: int | None
    delivery_id: str | None
    status: RunStatus
    started_at: str
    ended_at: str | None

    @property
    def identity(self) -> RunIdentity:
        return RunIdentity(
            mode=self.identity_mode,
            owner_user_id=self.owner_user_id,
            execution_user_id=self.execution_user_id,
            runtime_user_id=self.runtime_user_id,
        )


def _run(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        session_id=row["session_id"],
        trigger=Trigger(row["trigger"]),
        agent_id=row["agent_id"],
        identity_mode=IdentityMode(row["identity_mode"]),
        owner_user_id=row["owner_user_id"],
        execution_user_id=row["execution_user_id"],
        runtime_user_id=row["runtime_user_id"],
        speaker_user_id=row["speaker_user_id"],
        delivery_id=row["delivery_id"],
        status=RunStatus(row["status"]),
        started_at=row["started_at"],
        ended_at=row["ended_at"],
    )


@dataclass(frozen=True)
class StartRun:
    trigger: Trigger
    speaker_user_id: int | None = None
    agent_id: str = "default"
    delivery_id: str | None = None


@dataclass(frozen=True)
class RunContext:
    run: RunRecord
    workdir: str
    upload_dir: str
    skills: RunSkills
    archive_hint_enabled: bool
    memory_user_id: int
    prompt_identity_section: str | None


class RunRepository:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    @staticmethod
    def get_in(tx: Transaction, run_id: str) -> RunRecord | None:
        row = tx.one("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return _run(row) if row else None

    def get(self, run_id: str) -> RunRecord | None:
        with self._store.read() as tx:
            return self.get_in(tx, run_id)

    def running_in_session(self, session_id: str) -> list[RunRecord]:
        with self._store.read() as tx:
            rows = tx.all("SELECT * FROM runs WHERE session_id = ? AND status = 'running'", (session_id,))
        return [_run(row) for row in rows]

    @staticmethod
    def running_in_session_in(tx: Transaction, session_id: str) -> bool:
        return tx.one("SELECT 1 FROM runs WHERE session_id = ? AND status = 'running' LIMIT 1", (session_id,)) is not None

    @staticmethod
    def touch_in(tx: Transaction, run_id: str, at: str) -> None:
        """Note a tool call of the run (in the transaction that audits it: no write of its own)."""
        tx.execute("UPDATE runs SET last_activity_at = ? WHERE run_id = ?", (at, run_id))

    def idle_since(self, cutoff: str) -> list[str]:
        """Running runs whose last tool call (or start, without one) is older than `cutoff`."""
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT run_id FROM runs WHERE status = 'running'"
                " AND COALESCE(last_activity_at, started_at) < ? ORDER BY started_at",
                (cutoff,),
            )
        return [row["run_id"] for row in rows]

    @staticmethod
    def latest_user_run_in(
        tx: Transaction, session_id: str, triggers: Collection[Trigger], *, before: str
    ) -> RunRecord | None:
        """The newest run of the session with one of `triggers` and no delivery, started before `before`."""
        marks = ", ".join("?" for _ in triggers)
        row = tx.one(
            f"SELECT * FROM runs WHERE session_id = ? AND delivery_id IS NULL AND trigger IN ({marks})"
            " AND started_at < ? ORDER BY started_at DESC LIMIT 1",
            (session_id, *(t.value for t in triggers), before),
        )
        return _run(row) if row else None

    @staticmethod
    def user_run_started_after_in(tx: Transaction, session_id: str, run_id: str, triggers: Collection[Trigger]) -> bool:
        """Whether a run with one of `triggers` and no delivery started in the session after `run_id`."""
        marks = ", ".join("?" for _ in triggers)
        row = tx.one(
            f"SELECT 1 FROM runs WHERE session_id = ? AND delivery_id IS NULL AND trigger IN ({marks})"
            " AND run_id != ? AND started_at > (SELECT started_at FROM runs WHERE run_id = ?) LIMIT 1",
            (session_id, *(t.value for t in triggers), run_id, run_id),
        )
        return row is not None


RunListener = Callable[[RunRecord], None]
# Called inside the transaction that inserts the run, before the insert; raising refuses the start.
RunGuard = Callable[[Transaction, RunRecord], None]


class RunService:
    def __init__(
        self,
        *,
        settings: Settings,
        store: StateStore,
        sessions: SessionRepository,
        users: UserRepository,
        runs: RunRepository,
        switch: RuntimeIdentitySwitch,
        directories: UserDirectories,
        skills: SkillProvider,
    ) -> None:
        self._settings = settings
        self._layout = settings.layout
        self._store = store
        self._sessions = sessions
        self._users = users
        self._runs = runs
        self._switch = switch
        self._directories = directories
        self._skills = skills
        self.start_guards: list[RunGuard] = []
        self.start_listeners: list[RunListener] = []
        self.end_listeners: list[RunListener] = []

    def _persist_last_runtime_user(self, session: SessionRecord, user_id: int, *, reason: str) -> None:
        # D2: a failure to persist must not block the run; the in-memory value is authoritative.
        try:
            self._sessions.set_last_runtime_user(session.session_id, user_id)
        except sqlite3.Error as exc:
            log.warning(
                "could not persist last_runtime_user_id; the run continues with the in-memory value %s",
                kv(session=session.session_id, owner=session.owner_user_id, runtime_user=user_id, reason=reason, error=exc),
            )

    def start(self, session_id: str, request: StartRun, *, actor: str) -> RunContext:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"session {session_id} not found")
        if request.speaker_user_id is not None:
            self._users.admit(request.speaker_user_id, "speaker_user_id")
        last_runtime = session.last_runtime_user_id
        parent = None
        if request.trigger is Trigger.SUBAGENT and session.parent_session_id is not None:
            parent_record = self._sessions.get_any(session.parent_session_id)
            if parent_record is not None:
                parent = parent_record.parent_identity
                # seed 002 §5.8: every follow-up refreshes the child's identity from the parent.
                last_runtime = inherited_runtime_user(parent)
                self._persist_last_runtime_user(session, last_runtime, reason="subagent_inherit")
        try:
            identity = resolve_run_identity(
                self._switch.mode(),
                request.trigger,
                owner_user_id=session.owner_user_id,
                speaker_user_id=request.speaker_user_id,
                session_last_runtime_user_id=last_runtime,
                parent=parent,
            )
        except IdentityInputError as exc:
            raise InvalidInput(exc.message, field=exc.field) from exc
        runtime = self._users.admit(identity.runtime_user_id, "runtime_user_id")
        self._persist_last_runtime_user(session, runtime, reason="run_start")

        run = RunRecord(
            run_id=f"r-{secrets.token_hex(12)}",
            session_id=session.session_id,
            trigger=request.trigger,
            agent_id=ids.name(request.agent_id, "agent_id"),
            identity_mode=identity.mode,
            owner_user_id=identity.owner_user_id,
            execution_user_id=identity.execution_user_id,
            runtime_user_id=runtime,
            speaker_user_id=request.speaker_user_id,
            delivery_id=request.delivery_id,
            status=RunStatus.RUNNING,
            started_at=now_iso(),
            ended_at=None,
        )
        with self._store.write() as tx:
            if self._sessions.get_in(tx, session.session_id).deleted:  # type: ignore[union-attr]
                # Deleted since it was read above: no run (and no runtime dir) after the tombstone.
                raise NotFound(f"session {session_id} not found")
            for guard in self.start_guards:
                guard(tx, run)
            for user_id in {runtime, request.speaker_user_id} - {None}:
                UserRepository.ensure(tx, user_id)
            if session.group is not None and request.speaker_user_id is not None and request.trigger in SPEAKER_TRIGGERS:
                # SPEC §12: a user who speaks in a group session joins the group (its workspace mounts).
                UserRepository.add_group_member(tx, session.group, request.speaker_user_id)
            tx.execute(
                "INSERT OR IGNORE INTO session_runtime_users (session_id, user_id, first_at) VALUES (?, ?, ?)",
                (session.session_id, runtime, run.started_at),
            )
            tx.execute(
                "INSERT INTO runs (run_id, session_id, trigger, agent_id, identity_mode, owner_user_id,"
                " execution_user_id, runtime_user_id, speaker_user_id, delivery_id, status, started_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.run_id,
                    run.session_id,
                    run.trigger.value,
                    run.agent_id,
                    run.identity_mode.value,
                    run.owner_user_id,
                    run.execution_user_id,
                    run.runtime_user_id,
                    run.speaker_user_id,
                    run.delivery_id,
                    run.status.value,
                    run.started_at,
                ),
            )
            audit.record(
                tx,
                actor=actor,
                action="run.start",
                session_id=session.session_id,
                owner_user_id=run.owner_user_id,
                runtime_user_id=runtime,
                run_id=run.run_id,
                trigger=run.trigger.value,
                execution_user_id=run.execution_user_id,
                mode=run.identity_mode.value,
            )
        runlog = run_logger(log, session=session.session_id, owner=run.owner_user_id, runtime_user=runtime)

        workdir = self._directories.ensure_session_runtime(
            runtime, session.session_id, is_owner=identity.runtime_is_owner
        )
        upload_dir = self._directories.ensure_uploads(runtime)
        skills = self._skills.sync_for_run(
            run.agent_id, runtime, session.session_id, owner_user_id=run.owner_user_id
        )
        if skills.failed:
            runlog.warning("skills left out of this run %s", kv(failed=",".join(skills.failed)))
        context = RunContext(
            run=run,
            workdir=str(workdir),
            upload_dir=str(upload_dir),
            skills=skills,
            archive_hint_enabled=identity.runtime_is_owner,  # D6
            memory_user_id=runtime,  # D5: injection and extraction follow the runtime user
            prompt_identity_section=self._identity_section(session, identity),
        )
        for listener in self.start_listeners:
            listener(run)
        runlog.info(
            "run started %s",
            kv(run=run.run_id, trigger=run.trigger.value, execution_user=run.execution_user_id, mode=run.identity_mode.value),
        )
        return context

    def _identity_section(self, session: SessionRecord, identity: RunIdentity) -> str | None:
        if identity.runtime_is_owner:
            return None
        owner = self._users.get(identity.owner_user_id)
        runtime = self._users.get(identity.runtime_user_id)
        group_workspace = str(self._layout.group_dir(session.group)) if session.group else None
        return render_identity_section(
            IdentityPromptFacts(
                owner_user_id=identity.owner_user_id,
                owner_display_name=owner.display_name if owner else None,
                runtime_user_id=identity.runtime_user_id,
                runtime_display_name=runtime.display_name if runtime else None,
                uploads_root=str(self._layout.uploads_root),
                public_base_url=self._settings.public_base_url,
                group_workspace=group_workspace,
                share_dir=str(self._layout.share_dir),
            )
        )

    def get(self, run_id: str) -> RunRecord:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFound(f"run {run_id} not found")
        return run

    def cancel_running_of_deleted(self, deleted: DeletedSession) -> list[str]:
        """End every running run of a deleted session as cancelled (a cleanup STOP step).

        Goes through `end`, so end listeners see these runs end like any other.
        """
        cancelled = []
        for run in self._runs.running_in_session(deleted.session_id):
            try:
                self.end(run.run_id, RunStatus.CANCELLED, actor="session.delete")
                cancelled.append(run.run_id)
            except Conflict:
                pass  # it ended on its own meanwhile
        return cancelled

    def end(
        self,
        run_id: str,
        status: RunStatus,
        *,
        actor: str,
        reason: str | None = None,
        idle_before: str | None = None,
    ) -> RunRecord:
        """End a running run. `idle_before` (the sweeper's): only if its last tool call (or its
        start) is older than that, checked in the ending transaction, so a call that came in
        meanwhile keeps the run going (Conflict). `reason` goes to the audit row."""
        if status is RunStatus.RUNNING:
            raise InvalidInput("a run ends as succeeded, failed or cancelled", field="status")
        with self._store.write() as tx:
            row = tx.one("SELECT * FROM runs WHERE run_id = ?", (run_id,))
            if row is None:
                raise NotFound(f"run {run_id} not found")
            run = _run(row)
            if run.status is not RunStatus.RUNNING:
                raise Conflict(f"run {run_id} already ended as {run.status.value}")
            if idle_before is not None and (row["last_activity_at"] or run.started_at) >= idle_before:
                raise Conflict(f"run {run_id} was active again")
            ended_at = now_iso()
            tx.execute(
                "UPDATE runs SET status = ?, ended_at = ? WHERE run_id = ? AND status = 'running'",
                (status.value, ended_at, run_id),
            )
            audit.record(
                tx,
                actor=actor,
                action="run.end",
                session_id=run.session_id,
                owner_user_id=run.owner_user_id,
                runtime_user_id=run.runtime_user_id,
                run_id=run_id,
                status=status.value,
                **({"reason": reason} if reason is not None else {}),
            )
        ended = RunRecord(**{**run.__dict__, "status": status, "ended_at": ended_at})
        for listener in self.end_listeners:
            listener(ended)
        run_logger(log, session=run.session_id, owner=run.owner_user_id, runtime_user=run.runtime_user_id).info(
            "run ended %s", kv(run=run_id, status=status.value)
        )
        return ended
