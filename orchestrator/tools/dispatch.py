"""Dispatching one tool call of a run (SPEC §7, §12): validate, pick the acting identity from
the table, run it in the sandbox or on the host, audit it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from mounts.layout import DataLayout
from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.errors import Conflict, NotFound, ToolError
from orchestrator.idle_runs import CallsInFlight
from orchestrator.log import kv, run_logger
from orchestrator.runs import RunRepository, RunStatus
from orchestrator.sandboxes import SandboxRouter
from orchestrator.sessions import SessionRepository
from orchestrator.state_store import StateStore
from orchestrator.tools.identity_table import acting_user_for
from orchestrator.tools.registry import ToolCall, ToolPlace, ToolRegistry
from sandbox_agent.wire import CallContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        return {"ok": True, "result": self.result} if self.ok else {"ok": False, "error": self.error}


def invalid_arguments(exc: ValidationError) -> ToolError:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()[:5]
    )
    return ToolError("invalid_arguments", f"Invalid tool arguments: {problems}", field=field)


class ToolDispatcher:
    def __init__(
        self,
        *,
        layout: DataLayout,
        store: StateStore,
        registry: ToolRegistry,
        runs: RunRepository,
        sessions: SessionRepository,
        sandboxes: SandboxRouter,
        in_flight: CallsInFlight,
    ) -> None:
        self._layout = layout
        self._store = store
        self._registry = registry
        self._runs = runs
        self._sessions = sessions
        self._sandboxes = sandboxes
        self._in_flight = in_flight

    def dispatch(
        self, run_id: str, name: str, raw_arguments: dict[str, Any], *, tool_call_id: str | None, actor: str
    ) -> ToolOutcome:
        # Under way from before the run is read: the idle-run sweeper never ends a run mid-call.
        with self._in_flight.calling(run_id):
            return self._dispatch(run_id, name, raw_arguments, tool_call_id=tool_call_id, actor=actor)

    def _dispatch(
        self, run_id: str, name: str, raw_arguments: dict[str, Any], *, tool_call_id: str | None, actor: str
    ) -> ToolOutcome:
        # The run and its session from one snapshot, read live on every call: an ended run or
        # a deleted session refuses at once.
        with self._store.read() as tx:
            run = RunRepository.get_in(tx, run_id)
            session = SessionRepository.get_in(tx, run.session_id) if run is not None else None
        if run is None:
            raise NotFound(f"run {run_id} not found")
        if run.status is not RunStatus.RUNNING:
            raise Conflict(f"run {run_id} has ended ({run.status.value}); start a new run to call tools")
        if session is None or session.deleted:
            raise NotFound(f"session {run.session_id} not found")
        spec = self._registry.get(name)
        if spec is None:
            raise NotFound(f"unknown tool {name}; GET /v1/tools lists them")
        acting_user = acting_user_for(name, run.identity)
        workdir = str(self._layout.runtime_dir(run.runtime_user_id, run.session_id))
        started = time.perf_counter()
        try:
            try:
                arguments = spec.arguments.model_validate(raw_arguments)
            except ValidationError as exc:
                raise invalid_arguments(exc) from None
            if spec.place is ToolPlace.CONTAINER:
                result = self._sandboxes.call(
                    acting_user,
                    name,
                    arguments.model_dump(mode="json", exclude_none=True),
                    cwd=workdir,
                    context=CallContext(run_id=run.run_id, session_id=run.session_id),  # ending either stops it
                )
                if isinstance(result, BaseModel):  # a typed wire result (read_bytes): its JSON form
                    result = result.model_dump(mode="json")
            else:
                assert spec.handler is not None
                result = spec.handler(
                    ToolCall(
                        run=run,
                        session=session,
                        acting_user_id=acting_user,
                        workdir=workdir,
                        arguments=arguments,
                        tool_call_id=tool_call_id,
                    )
                )
            outcome = ToolOutcome(ok=True, result=result)
        except ToolError as exc:
            outcome = ToolOutcome(ok=False, error=exc.body())
        duration_ms = round((time.perf_counter() - started) * 1000, 3)
        code = None if outcome.ok else outcome.error["code"]  # type: ignore[index]
        with self._store.write() as tx:
            audit.record(
                tx,
                actor=actor,
                action="tool.call",
                session_id=run.session_id,
                owner_user_id=run.owner_user_id,
                runtime_user_id=run.runtime_user_id,
                run_id=run.run_id,
                tool=name,
                acting_user_id=acting_user,
                outcome="ok" if outcome.ok else code,
                duration_ms=duration_ms,
            )
            RunRepository.touch_in(tx, run.run_id, now_iso())  # the run's last activity, same write
        run_logger(log, session=run.session_id, owner=run.owner_user_id, runtime_user=run.runtime_user_id).info(
            "tool call %s", kv(run=run.run_id, tool=name, acting_user=acting_user, outcome=code or "ok", ms=duration_ms)
        )
        return outcome
