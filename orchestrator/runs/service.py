"""Runs: resolving the identities of a run, persisting them, and building its context (docs/bots.md)."""

from __future__ import annotations

import logging
import secrets
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from mounts import ids
from mounts.layout import OUTPUTS_SUBDIR, DataLayout
from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.errors import Conflict, InvalidInput, NotFound
from orchestrator.identity import (
    IdentityInputError,
    RunIdentity,
    Trigger,
    inherited_runtime_user,
    resolve_run_identity,
)
from orchestrator.runs.identity_switch import RuntimeIdentitySwitch
from orchestrator.log import kv, run_logger
from orchestrator.runs.prompt_identity import (
    DelegatedCredential,
    IdentityPromptFacts,
    render_identity_section,
    render_template_section,
)
from orchestrator.runs.start_access import run_start_access
from orchestrator.sessions.cleanup import DeletedSession
from orchestrator.sessions.records import SessionRecord, SessionRepository
from orchestrator.sessions.visibility import read_visible
from orchestrator.skills.port import RunSkills, SkillProvider
from orchestrator.state_store import StateStore, Transaction
from orchestrator.templates.choice import RunTemplate
from orchestrator.users.dirs import UserDirectories
from orchestrator.users.repository import UserRepository
from orchestrator.runs.records import RunRecord, RunRepository, RunStatus, run_from_row

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartRun:
    trigger: Trigger
    speaker_user_id: int | None = None
    agent_id: str = "default"
    delivery_id: str | None = None
    template: str | None = None  # a template the bot asks for (checked by the caller: requestable)


class RunTemplates(Protocol):
    """The template a run's calls use and what its skills lack (orchestrator/templates/)."""

    def plan_run(self, run: RunRecord, skills: RunSkills, requested: str | None) -> RunTemplate: ...

    def run_of(self, run_id: str) -> RunTemplate | None: ...


@dataclass(frozen=True)
class RunContext:
    run: RunRecord
    workdir: str
    upload_dir: str
    outputs_dir: str
    group_workspace: str | None
    skills: RunSkills
    archive_hint_enabled: bool
    memory_user_id: int
    prompt_identity_section: str | None
    delegated_credentials: tuple[DelegatedCredential, ...] = ()
    template: RunTemplate | None = None


RunListener = Callable[[RunRecord], None]
# Called inside the transaction that inserts the run, before the insert; raising refuses the start.
RunGuard = Callable[[Transaction, RunRecord], None]


class RunService:
    def __init__(
        self,
        *,
        layout: DataLayout,
        public_base_url: str,
        store: StateStore,
        sessions: SessionRepository,
        users: UserRepository,
        runs: RunRepository,
        switch: RuntimeIdentitySwitch,
        directories: UserDirectories,
        skills: SkillProvider,
        templates: RunTemplates | None = None,
        start_guards: Sequence[RunGuard] = (),
        start_listeners: Sequence[RunListener] = (),
        end_listeners: Sequence[RunListener] = (),
        delegated_to: Callable[[int, str], tuple[DelegatedCredential, ...]] = lambda _user_id, _session_id: (),
    ) -> None:
        """`start_guards` run in a start's transaction (a refusal raises); `start_listeners` and
        `end_listeners` after a run started or ended; `delegated_to`: the credentials delegated
        to (runtime user, session) now (orchestrator/credentials/)."""
        self._layout = layout
        self._public_base_url = public_base_url
        self._store = store
        self._sessions = sessions
        self._users = users
        self._runs = runs
        self._switch = switch
        self._directories = directories
        self._skills = skills
        self.templates = templates
        self.start_guards: list[RunGuard] = list(start_guards)
        self.start_listeners: list[RunListener] = list(start_listeners)
        self.delegated_to = delegated_to
        self.end_listeners: list[RunListener] = list(end_listeners)

    def _persist_last_runtime_user(self, session: SessionRecord, user_id: int, *, reason: str) -> None:
        # A failure to persist must not block the run; the in-memory value is authoritative.
        try:
            self._sessions.set_last_runtime_user(session.session_id, user_id)
        except sqlite3.Error as exc:
            log.warning(
                "could not persist last_runtime_user_id; the run continues with the in-memory value %s",
                kv(session=session.session_id, owner=session.owner_user_id, runtime_user=user_id, reason=reason, error=exc),
            )

    def start(
        self, session_id: str, request: StartRun, *, actor: str, acting_user: int | None = None
    ) -> RunContext:
        """Start a run in the session as `acting_user` sees it (None: the bot, trusted for
        everyone; see `start_access.py`). One write transaction reads the session, checks that
        it is visible, resolves the identities, runs the start guards, lets a speaker join the
        group and inserts the run: a start refused anywhere in it (not visible, bad identity
        input, a guard) leaves nothing behind, not even the session's last runtime user."""
        access = run_start_access(request.trigger, request.speaker_user_id, acting_user)
        mode = self._switch.mode()
        with self._store.write() as tx:
            session = read_visible(tx, session_id, acting_user, owner_only=access.owner_only)
            if request.speaker_user_id is not None:
                self._users.admit(request.speaker_user_id, "speaker_user_id")
            last_runtime = session.last_runtime_user_id
            parent = None
            if request.trigger is Trigger.SUBAGENT and session.parent_session_id is not None:
                parent_record = self._sessions.get_in(tx, session.parent_session_id)
                if parent_record is not None:
                    parent = parent_record.parent_identity
                    # Every follow-up refreshes the child's identity from the parent.
                    last_runtime = inherited_runtime_user(parent)
            try:
                identity = resolve_run_identity(
                    mode,
                    request.trigger,
                    owner_user_id=session.owner_user_id,
                    speaker_user_id=request.speaker_user_id,
                    session_last_runtime_user_id=last_runtime,
                    parent=parent,
                )
            except IdentityInputError as exc:
                raise InvalidInput(exc.message, field=exc.field) from exc
            runtime = self._users.admit(identity.runtime_user_id, "runtime_user_id")
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
            for guard in self.start_guards:
                guard(tx, run)
            for user_id in {runtime, request.speaker_user_id} - {None}:
                UserRepository.ensure(tx, user_id)
            joining = access.joining(session.group, request.speaker_user_id)
            if joining is not None:
                # A user who speaks in a group session joins the group (its workspace mounts).
                assert session.group is not None
                UserRepository.add_group_member(tx, session.group, joining)
            SessionRepository.add_runtime_user(tx, session.session_id, runtime, at=run.started_at)
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
        # Its own write, after the run's: a failure to persist it must never refuse the run.
        self._persist_last_runtime_user(session, runtime, reason="run_start")
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
        template = self.templates.plan_run(run, skills, request.template) if self.templates is not None else None
        if template is not None and template.lacking:
            runlog.info("skills lack their template %s", kv(run=run.run_id, lacking=",".join(f"{s}:{t}" for s, t, _ in template.lacking)))
        context = RunContext(
            run=run,
            workdir=str(workdir),
            upload_dir=str(upload_dir),
            outputs_dir=str(workdir / OUTPUTS_SUBDIR),
            group_workspace=str(self._layout.group_dir(session.group)) if session.group else None,
            skills=skills,
            archive_hint_enabled=identity.runtime_is_owner,  # archives are the owner's
            memory_user_id=runtime,  # memory injection and extraction follow the runtime user
            prompt_identity_section=self._prompt_section(session, identity, template),
            template=template,
            delegated_credentials=self.delegated_to(runtime, session.session_id),
        )
        for listener in self.start_listeners:
            listener(run)
        runlog.info(
            "run started %s",
            kv(run=run.run_id, trigger=run.trigger.value, execution_user=run.execution_user_id, mode=run.identity_mode.value),
        )
        return context

    def identity_section_of(self, run: RunRecord) -> str | None:
        """The prompt identity section of a run that has started (the MCP endpoint's
        instructions): rendered again from the run's identities, as at its start."""
        session = self._sessions.get(run.session_id)
        if session is None:
            raise NotFound(f"session {run.session_id} not found")
        template = self.templates.run_of(run.run_id) if self.templates is not None else None
        return self._prompt_section(session, run.identity, template)

    def _prompt_section(self, session: SessionRecord, identity: RunIdentity, template: RunTemplate | None) -> str | None:
        """The identity section, then what the run's skills lack (only when they lack something)."""
        parts = [self._identity_section(session, identity), render_template_section(template) if template else None]
        present = [part for part in parts if part]
        return "\n\n".join(present) if present else None

    def _identity_section(self, session: SessionRecord, identity: RunIdentity) -> str | None:
        delegated = self.delegated_to(identity.runtime_user_id, session.session_id)
        if identity.runtime_is_owner and session.group is None and not delegated:
            return None
        owner = self._users.get(identity.owner_user_id)
        runtime = self._users.get(identity.runtime_user_id)
        speaker = self._users.get(identity.execution_user_id) if identity.execution_user_id is not None else None
        group_workspace = str(self._layout.group_dir(session.group)) if session.group else None
        return render_identity_section(
            IdentityPromptFacts(
                owner_user_id=identity.owner_user_id,
                owner_display_name=owner.display_name if owner else None,
                runtime_user_id=identity.runtime_user_id,
                runtime_display_name=runtime.display_name if runtime else None,
                uploads_root=str(self._layout.uploads_root),
                public_base_url=self._public_base_url,
                group_workspace=group_workspace,
                share_dir=str(self._layout.share_dir),
                speaker_user_id=identity.execution_user_id,
                speaker_display_name=speaker.display_name if speaker else None,
                delegated=delegated,
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
            run = run_from_row(row)
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
