"""Collaboration between sessions: the inbox a chat bot polls, the list of a
session's requests, and stop."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool

from orchestrator.collaboration.coordinator import REQUEST_ID, CollaborationService
from orchestrator.collaboration.long_poll import next_delivery
from orchestrator.errors import InvalidInput
from orchestrator.http.auth import Caller, acting_user, require_bot
from orchestrator.http.collaboration_models import CollaborationListOut, CollaborationOut, InboxDeliveryOut, InboxOut, StopOut
from orchestrator.http.params import SQLITE_INT_MAX, session_id_param
from orchestrator.http.parts import api_settings_of, collaboration_of, sessions_of
from orchestrator.sessions.service import SessionService
from orchestrator.settings import ApiSettings

router = APIRouter(tags=["collaboration"])


def request_id_param(request_id: str = Path(..., max_length=64, json_schema_extra={"pattern": f"^{REQUEST_ID.pattern}$"})) -> str:
    if not REQUEST_ID.fullmatch(request_id):
        raise InvalidInput("request_id must be a collaboration request id (cr-…)", field="request_id")
    return request_id


@router.get("/v1/sessions/{session_id}/inbox", response_model=InboxOut)
async def inbox(
    request: Request,
    session_id: str = Depends(session_id_param),
    wait_s: float = Query(0.0, ge=0, description="Wait up to this long for a delivery (long-poll)."),
    acting: int | None = Depends(acting_user),
    api: ApiSettings = Depends(api_settings_of),
    sessions: SessionService = Depends(sessions_of),
    collaboration: CollaborationService = Depends(collaboration_of),
    _: Caller = Depends(require_bot),
) -> InboxOut:
    """The session's next delivery, claimed for the caller: start a run with its `delivery_id`
    within `claim_expires_at`. `{"delivery": null}` when nothing came within `wait_s`."""
    limit = api.collaboration_inbox_wait_max_s
    if wait_s > limit:
        raise InvalidInput(f"wait_s may be at most {limit:g} seconds", field="wait_s")
    await run_in_threadpool(sessions.get, session_id, acting_user=acting)
    item = await next_delivery(collaboration, session_id, wait_s, request.is_disconnected)
    return InboxOut(delivery=InboxDeliveryOut.of(item) if item else None)


@router.get("/v1/sessions/{session_id}/collaborations", response_model=CollaborationListOut)
def list_collaborations(
    session_id: str = Depends(session_id_param),
    limit: int = Query(20, ge=1, le=100),
    before: int | None = Query(None, ge=1, le=SQLITE_INT_MAX, description="next_before of the previous page"),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    collaboration: CollaborationService = Depends(collaboration_of),
    _: Caller = Depends(require_bot),
) -> CollaborationListOut:
    sessions.get(session_id, acting_user=acting)
    views = collaboration.list(session_id, before=before, limit=limit)
    next_before = views[-1].request.seq if len(views) == limit else None
    return CollaborationListOut(
        collaborations=[CollaborationOut.of(v, session_id) for v in views], next_before=next_before
    )


@router.get("/v1/sessions/{session_id}/collaborations/{request_id}", response_model=CollaborationOut)
def get_collaboration(
    session_id: str = Depends(session_id_param),
    request_id: str = Depends(request_id_param),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    collaboration: CollaborationService = Depends(collaboration_of),
    _: Caller = Depends(require_bot),
) -> CollaborationOut:
    sessions.get(session_id, acting_user=acting)
    return CollaborationOut.of(collaboration.get(session_id, request_id), session_id)


@router.post("/v1/sessions/{session_id}/collaborations/{request_id}/stop", response_model=StopOut)
def stop_collaboration(
    session_id: str = Depends(session_id_param),
    request_id: str = Depends(request_id_param),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    collaboration: CollaborationService = Depends(collaboration_of),
    caller: Caller = Depends(require_bot),
) -> StopOut:
    """Stop one request this session made: its answers start nothing any more (revoked), what has
    not started is cancelled, a continuation run already started is cancelled."""
    sessions.get(session_id, acting_user=acting, owner_only=True)
    result = collaboration.stop(session_id, request_id, actor=caller.actor)
    return StopOut(
        collaboration=CollaborationOut.of(result.view, session_id), cancelled_run_ids=result.cancelled_run_ids
    )
