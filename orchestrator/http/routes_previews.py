"""Preview links (docs/previews.md): `POST /v1/runs/{run_id}/previews` makes one for a port
the run's runtime user's sandbox listens on, `GET` there lists the run's live ones,
`GET`/`DELETE /v1/previews/{preview_id}` read and revoke one. The links themselves are served on the preview listener, never here."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import NotFound
from orchestrator.http.acting import own_run, visible_run
from orchestrator.http.auth import Caller, acting_user, require_bot
from orchestrator.http.params import run_id_param
from orchestrator.http.parts import RunReach, previews_of, run_reach_of
from orchestrator.previews.service import PreviewService
from orchestrator.previews.tools import preview_answer

router = APIRouter()


class PreviewCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = Field(..., ge=1, le=65535, description="The port the sandbox listens on (127.0.0.1 inside it).")
    ttl_s: int | None = Field(None, gt=0, description="Seconds the link lives; default ORCH_PREVIEW_TTL_S.")


class PreviewOut(BaseModel):
    preview_id: str
    url: str
    port: int
    expires_at: str


class PreviewListOut(BaseModel):
    run_id: str
    previews: list[PreviewOut]


def _switched_on(previews: PreviewService | None) -> PreviewService:
    if previews is None:
        raise NotFound("previews are off on this server (ORCH_PREVIEW_LISTEN is not set)", code="previews_off")
    return previews


def _preview_id(preview_id: str = Path(..., max_length=64, pattern=r"^pv_[0-9a-f]{32}$")) -> str:
    return preview_id


@router.post("/v1/runs/{run_id}/previews", status_code=201, response_model=PreviewOut, tags=["previews"])
def create_preview(
    body: PreviewCreate,
    run_id: str = Depends(run_id_param),
    acting: int | None = Depends(acting_user),
    previews: PreviewService | None = Depends(previews_of),
    reach: RunReach = Depends(run_reach_of),
    caller: Caller = Depends(require_bot),
) -> PreviewOut:
    previews = _switched_on(previews)
    record = previews.create(own_run(reach, run_id, acting), body.port, body.ttl_s, actor=caller.actor)
    return PreviewOut(**preview_answer(previews, record))


@router.get("/v1/runs/{run_id}/previews", response_model=PreviewListOut, tags=["previews"])
def list_previews(
    run_id: str = Depends(run_id_param),
    acting: int | None = Depends(acting_user),
    previews: PreviewService | None = Depends(previews_of),
    reach: RunReach = Depends(run_reach_of),
    _: Caller = Depends(require_bot),
) -> PreviewListOut:
    previews = _switched_on(previews)
    visible_run(reach, run_id, acting)  # 404 for an unknown (or invisible) run
    return PreviewListOut(run_id=run_id, previews=[PreviewOut(**preview_answer(previews, r)) for r in previews.of_run(run_id)])


@router.get("/v1/previews/{preview_id}", response_model=PreviewOut, tags=["previews"])
def get_preview(
    preview_id: str = Depends(_preview_id),
    acting: int | None = Depends(acting_user),
    previews: PreviewService | None = Depends(previews_of),
    reach: RunReach = Depends(run_reach_of),
    _: Caller = Depends(require_bot),
) -> PreviewOut:
    previews = _switched_on(previews)
    record = previews.get(preview_id)
    visible_run(reach, record.run_id, acting)  # another person's preview is a plain 404
    return PreviewOut(**preview_answer(previews, record))


@router.delete("/v1/previews/{preview_id}", status_code=204, tags=["previews"])
def delete_preview(
    preview_id: str = Depends(_preview_id),
    acting: int | None = Depends(acting_user),
    previews: PreviewService | None = Depends(previews_of),
    reach: RunReach = Depends(run_reach_of),
    caller: Caller = Depends(require_bot),
) -> Response:
    previews = _switched_on(previews)
    visible_run(reach, previews.get(preview_id).run_id, acting)
    previews.revoke(preview_id, actor=caller.actor)
    return Response(status_code=204)
