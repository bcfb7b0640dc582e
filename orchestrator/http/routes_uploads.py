"""Files from the chat into a sandbox: `PUT /v1/runs/{run_id}/files/incoming/{name}` (bot token).

The body is the file's bytes, streamed to disk (`orchestrator/users/incoming.py` says where
and how). `?scope=personal` (default) puts it into the run's runtime user's
`runtime/{uid}/{sid}/incoming/`; `?scope=group` into the group chat's
`chat-files/{YYYY-MM-DD}/` of its workspace, readable by every member's sandbox. The answer
names the path to hand the model; a taken name gets a numbered variant, never overwritten.
"""

from __future__ import annotations

import logging

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel

from orchestrator.errors import Conflict
from orchestrator.http.acting import own_run
from orchestrator.http.auth import Caller, acting_user, require_bot
from orchestrator.http.params import run_id_param
from orchestrator.http.parts import RunReach, incoming_of, run_reach_of, sessions_of
from orchestrator.log import kv
from orchestrator.runs.records import RunStatus
from orchestrator.sessions.service import SessionService
from orchestrator.users.incoming import NAME_MAX_BYTES, IncomingFiles, IncomingUpload, UploadScope, UploadTooLarge

log = logging.getLogger(__name__)
router = APIRouter()


class IncomingFileOut(BaseModel):
    path: str
    name: str
    size: int
    scope: UploadScope
    runtime_user_id: int
    note: str


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


@router.put(
    "/v1/runs/{run_id}/files/incoming/{name}",
    response_model=IncomingFileOut,
    status_code=201,
    tags=["files"],
    summary="Upload a file from the chat into the run's sandbox (the path to hand the model comes back)",
    responses={409: {"description": "run ended, unsafe directory or no free name"}, 413: {"description": "too large"}, 507: {"description": "no room on the data filesystem"}},
)
async def upload_incoming(
    request: Request,
    run_id: str = Depends(run_id_param),
    name: str = Path(..., min_length=1, max_length=NAME_MAX_BYTES),
    scope: UploadScope = Query(UploadScope.PERSONAL, description="personal: the runtime user's incoming/; group: the group chat's chat-files/{date}/"),
    acting: int | None = Depends(acting_user),
    incoming: IncomingFiles = Depends(incoming_of),
    reach: RunReach = Depends(run_reach_of),
    sessions: SessionService = Depends(sessions_of),
    _: Caller = Depends(require_bot),
) -> IncomingFileOut:
    cap = incoming.max_bytes
    declared = _declared_length(request)
    if declared is not None and declared > cap:
        raise UploadTooLarge(f"the upload is {declared} bytes; at most {cap} are accepted (ORCH_UPLOAD_MAX_BYTES)")
    run = own_run(reach, run_id, acting)
    if run.status is not RunStatus.RUNNING:
        raise Conflict(f"run {run_id} has ended ({run.status.value}); upload into a running run")
    group = sessions.get(run.session_id).group
    upload: IncomingUpload = await anyio.to_thread.run_sync(incoming.begin, run, group, name, scope)
    try:
        async for chunk in request.stream():
            upload.write(chunk)  # local writes of at most one network chunk: no thread hop each
        path = await anyio.to_thread.run_sync(upload.commit)
    finally:
        upload.abort()
    log.info(
        "incoming file %s",
        kv(run=run.run_id, session=run.session_id, runtime_user=run.runtime_user_id, scope=scope.value, bytes=upload.size, path=path),
    )
    return IncomingFileOut(
        path=str(path),
        name=path.name,
        size=upload.size,
        scope=scope,
        runtime_user_id=run.runtime_user_id,
        note="Hand `path` to the model: its tools (read_file, read_bytes, shell) read the file there.",
    )
