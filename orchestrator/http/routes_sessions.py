"""Sessions, runs and tool calls."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path

from orchestrator.http.auth import Caller, acting_user, require_bot, service_of
from orchestrator.http.models import (
    RunContextOut,
    RunEnd,
    RunOut,
    RunStart,
    SessionCreate,
    SessionOut,
    SessionPatch,
    ToolCallIn,
)
from orchestrator.http.params import run_id_param, session_id_param
from orchestrator.runs import RunStatus, StartRun
from orchestrator.service import OrchestratorService
from orchestrator.sessions import NewSession

router = APIRouter()


@router.post("/v1/sessions", status_code=201, response_model=SessionOut, tags=["sessions"])
def create_session(
    body: SessionCreate,
    service: OrchestratorService = Depends(service_of),
    caller: Caller = Depends(require_bot),
) -> SessionOut:
    record = service.sessions.create(
        NewSession(
            owner_user_id=body.owner_user_id,
            channel=body.channel,
            session_id=body.session_id,
            project_id=body.project_id,
            group=body.group.ref() if body.group else None,
            parent_session_id=body.parent_session_id,
            title=body.title,
        ),
        actor=caller.actor,
    )
    return SessionOut.of(record)


@router.get("/v1/sessions/{session_id}", response_model=SessionOut, tags=["sessions"])
def get_session(
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_bot),
) -> SessionOut:
    return SessionOut.of(service.sessions.get(session_id, acting_user=acting))


@router.patch("/v1/sessions/{session_id}", response_model=SessionOut, tags=["sessions"])
def patch_session(
    body: SessionPatch,
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    service: OrchestratorService = Depends(service_of),
    caller: Caller = Depends(require_bot),
) -> SessionOut:
    service.sessions.get(session_id, acting_user=acting, owner_only=True)
    changes = body.model_dump(exclude_unset=True)
    return SessionOut.of(service.sessions.update(session_id, changes, actor=caller.actor))


@router.delete("/v1/sessions/{session_id}", tags=["sessions"])
def delete_session(
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    service: OrchestratorService = Depends(service_of),
    caller: Caller = Depends(require_bot),
) -> dict:
    service.sessions.get(session_id, acting_user=acting, owner_only=True)
    service.sessions.delete(session_id, actor=caller.actor)
    return {"session_id": session_id, "deleted": True}


@router.post("/v1/sessions/{session_id}/runs", status_code=201, response_model=RunContextOut, tags=["runs"])
def start_run(
    body: RunStart,
    session_id: str = Depends(session_id_param),
    service: OrchestratorService = Depends(service_of),
    caller: Caller = Depends(require_bot),
) -> RunContextOut:
    context = service.runs.start(
        session_id,
        StartRun(
            trigger=body.trigger,
            speaker_user_id=body.speaker_user_id,
            agent_id=body.agent_id,
            delivery_id=body.delivery_id,
        ),
        actor=caller.actor,
    )
    return RunContextOut.of(context)


@router.get("/v1/runs/{run_id}", response_model=RunOut, tags=["runs"])
def get_run(
    run_id: str = Depends(run_id_param),
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_bot),
) -> RunOut:
    return RunOut.of(service.runs.get(run_id))


@router.post("/v1/runs/{run_id}/end", response_model=RunOut, tags=["runs"])
def end_run(
    body: RunEnd | None = None,
    run_id: str = Depends(run_id_param),
    service: OrchestratorService = Depends(service_of),
    caller: Caller = Depends(require_bot),
) -> RunOut:
    status = RunStatus((body or RunEnd()).status)
    return RunOut.of(service.runs.end(run_id, status, actor=caller.actor))


@router.get("/v1/tools", tags=["tools"])
def list_tools(service: OrchestratorService = Depends(service_of), _: Caller = Depends(require_bot)) -> dict:
    return {"tools": service.tools.describe()}


@router.post("/v1/runs/{run_id}/tools/{name}", tags=["tools"])
def call_tool(
    body: ToolCallIn,
    run_id: str = Depends(run_id_param),
    name: str = Path(..., max_length=100),
    service: OrchestratorService = Depends(service_of),
    caller: Caller = Depends(require_bot),
) -> dict:
    outcome = service.dispatcher.dispatch(
        run_id, name, body.arguments, tool_call_id=body.tool_call_id, actor=caller.actor
    )
    return outcome.body()
