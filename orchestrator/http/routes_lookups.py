"""Lookups a chat bot makes (docs/operations.md, "Lookups"): a session's runs, page by page,
and a user's sandbox: its backend, state, since when, and the user's last tool call. The same
visibility as the routes beside them: with `X-Acting-User`, the runs of a session that person
can see, and its own sandbox only."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from orchestrator.errors import NotFound
from orchestrator.http.acting import require_self
from orchestrator.http.auth import Caller, acting_user, require_bot
from orchestrator.http.models import RunOut
from orchestrator.http.params import session_id_param, user_id_param
from orchestrator.http.parts import identities_of, run_repo_of, sessions_of, user_listing_of
from orchestrator.http.people import with_run_identities
from orchestrator.runs.records import MAX_RUN_SEQ, RunRepository
from orchestrator.sessions.service import SessionService
from orchestrator.users.identities import IdentityRepository
from orchestrator.users.listing import UserListing

router = APIRouter()


class RunListOut(BaseModel):
    session_id: str
    runs: list[RunOut]  # newest first
    next_before: int | None  # pass as `before` for the next (older) page; None: no more


class SandboxOut(BaseModel):
    user_id: int
    backend: str  # the backend this user's sandbox runs on (its override, or the default)
    state: str  # running | paused | stopped | failed | none (no sandbox: it starts with the next call)
    since: str | None  # when the sandbox started (running) or stopped (a stopped container)
    busy: int  # the user's calls in flight
    last_call_at: str | None  # the user's last tool call (as a run's runtime user), or None


@router.get("/v1/sessions/{session_id}/runs", response_model=RunListOut, tags=["runs"])
def list_runs(
    session_id: str = Depends(session_id_param),
    limit: int = Query(20, ge=1, le=100),
    before: int | None = Query(None, ge=1, le=MAX_RUN_SEQ, description="next_before of the previous page"),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    run_repo: RunRepository = Depends(run_repo_of),
    identities: IdentityRepository = Depends(identities_of),
    _: Caller = Depends(require_bot),
) -> RunListOut:
    sessions.get(session_id, acting_user=acting)
    page = run_repo.page_of_session(session_id, before=before, limit=limit)
    next_before = page[-1][0] if len(page) == limit else None
    listing = RunListOut(session_id=session_id, runs=[RunOut.model_validate(run) for _, run in page], next_before=next_before)
    with_run_identities(identities, listing.runs)
    return listing


@router.get("/v1/users/{user_id}/sandbox", response_model=SandboxOut, tags=["users"])
def get_sandbox(
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    listing: UserListing = Depends(user_listing_of),
    _: Caller = Depends(require_bot),
) -> SandboxOut:
    """Never starts a sandbox. 404 for a user the server does not know."""
    require_self(acting, user_id)
    view = listing.sandbox_of(user_id)
    if view is None:
        raise NotFound(f"user {user_id} not found")
    return SandboxOut.model_validate(view, from_attributes=True)
