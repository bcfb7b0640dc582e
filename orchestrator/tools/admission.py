"""Whether a tool call runs: the one decision, pure, over what the dispatcher read in its
transaction (the run, its session, the tool's spec, the raw arguments).

`admit` answers `Refused` or `Admitted`; `tools/call_records.py`'s `Repeats.admit` wraps it
for a call with a `tool_call_id` and may answer `Repeat` instead (the first call's recorded
result, or wait for it). The dispatcher then takes the acting user's call slot in the call
ledger (`busy` refuses) and writes the audit row; nothing here has an effect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from orchestrator.errors import NotFound, OrchestratorError, RunEnded, ToolError
from orchestrator.runs.records import RunRecord, RunStatus, person_of
from orchestrator.sessions.records import SessionRecord
from orchestrator.sessions.visibility import IsMember, Sight, cleanup_pending, sight
from orchestrator.tools.identity_table import acting_user_for
from orchestrator.tools.registry import ToolSpec


@dataclass(frozen=True)
class Refused:
    """Answered without running. A `ToolError` is the call's result, audited under
    `acting_user`; any other error (a run that is gone or ended, a deleted session) is the
    request's (an HTTP error, not audited) and `acting_user` is None."""

    error: OrchestratorError
    acting_user: int | None = None

    @property
    def is_tool_result(self) -> bool:
        return isinstance(self.error, ToolError)


@dataclass(frozen=True)
class Repeat:
    """A repeat of a (run, tool_call_id) seen before: the first call's answer (a result
    body), or None while it still runs here (wait for it)."""

    body: dict[str, Any] | None


@dataclass(frozen=True)
class Admitted:
    """A call that runs: its tool, its validated arguments and who it acts as. `tool_call_id`
    and `digest` are set when its result is recorded for repeats."""

    spec: ToolSpec
    acting_user: int
    arguments: BaseModel
    tool_call_id: str | None = None
    digest: str = ""


Admission = Union[Refused, Repeat, Admitted]


def admit(
    run_id: str, run: RunRecord | None, session: SessionRecord | None, name: str, spec: ToolSpec | None,
    raw_arguments: dict[str, Any], *, tool_names: Callable[[], list[str]],
) -> Refused | Admitted:  # fmt: skip
    """The run and its session as read live on this call: an ended run or a deleted session
    refuses at once. An invented tool name acts as nobody (audited under the runtime user);
    bad arguments are the tool result `invalid_arguments`."""
    if run is None:
        return Refused(NotFound(f"run {run_id} not found"))
    if run.status is not RunStatus.RUNNING:
        return Refused(RunEnded(f"run {run_id} has ended ({run.status.value}); start a new run to call tools"))
    if session is None or session.deleted:
        return Refused(NotFound(f"session {run.session_id} not found"))
    if spec is None:
        return Refused(unknown_tool(name, tool_names()), run.runtime_user_id)
    acting_user = acting_user_for(name, run.identity)
    try:
        arguments = spec.arguments.model_validate(raw_arguments)
    except ValidationError as exc:
        return Refused(invalid_arguments(exc), acting_user)
    return Admitted(spec, acting_user, arguments)


def person_refusal(
    run_id: str, run: RunRecord | None, session: SessionRecord | None, acting: int, is_member: IsMember
) -> OrchestratorError | None:
    """With `X-Acting-User`, a person calls tools only in a run it is the person of, in a
    session it sees (docs/decisions.md): otherwise the run is not found, as the other run routes
    answer (a deleted session whose cleanup its owner has yet to finish: that 503). Checked
    before anything else, a repeat's record included."""
    if run is None:
        return NotFound(f"run {run_id} not found")
    seen = sight(session, acting, is_member)
    if seen is Sight.CLEANUP_PENDING:
        return cleanup_pending(run.session_id, "repeat DELETE to finish it")
    if seen is Sight.HIDDEN or acting != person_of(run):
        return NotFound(f"run {run_id} not found")
    return None


def invalid_arguments(exc: ValidationError) -> ToolError:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()[:5]
    )
    return ToolError("invalid_arguments", f"Invalid tool arguments: {problems}", field=field)


def unknown_tool(name: str, tools: list[str]) -> ToolError:
    shown = name if len(name) <= 100 else name[:100] + "..."
    return ToolError("unknown_tool", f"There is no tool named {shown!r}; call one of the listed tools", tools=tools)
