"""Sessions, runs and tool calls."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from mounts import ids
from mounts.layout import GroupRef
from orchestrator.errors import InvalidInput
from orchestrator.http.chat_models import (
    MESSAGES_READ_DEFAULT,
    MESSAGES_READ_MAX,
    AppendOut,
    DeletedOut,
    MessageOut,
    MessagesIn,
    MessagesOut,
    SessionListOut,
)

from orchestrator.http.acting import own_run, visible_run
from orchestrator.http.openapi import ABSOLUTE_CAP
from orchestrator.http.auth import Caller, acting_user, require_bot
from orchestrator.http.models import (
    RunContextOut,
    RunEnd,
    RunOut,
    RunStart,
    SessionCreate,
    SessionOut,
    SessionPatch,
    ToolCallIn,
    ToolCallOut,
)
from orchestrator.http.params import run_id_param, session_id_param
from orchestrator.http.parts import (
    RunReach,
    ToolCallParts,
    api_settings_of,
    identities_of,
    run_reach_of,
    runs_of,
    sessions_of,
    templates_of,
    tool_call_parts_of,
    tools_of,
    users_of,
)
from orchestrator.http.people import person_user_id, with_run_identities, with_session_identities
from orchestrator.http.streamed_json import StreamedReadBytesResponse
from orchestrator.http.stream_descriptors import hold_stream_descriptors
from sandbox_agent.wire import STREAMED_TOOLS
from orchestrator.http.tool_stream import stream_tool_call, wants_events
from orchestrator.runs.records import RunStatus
from orchestrator.runs.service import RunService, StartRun
from orchestrator.settings import ApiSettings
from orchestrator.templates.service import TemplateService
from orchestrator.tools.registry import MAX_TOOL_SUBSET_CHARS, ToolRegistry, tool_subset
from orchestrator.sessions.service import NewSession, SessionListRequest, SessionService
from orchestrator.users.identities import IdentityRepository
from orchestrator.users.repository import UserRepository

router = APIRouter()


@router.post("/v1/sessions", status_code=201, response_model=SessionOut, tags=["sessions"])
def create_session(
    body: SessionCreate,
    response: Response,
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    users: UserRepository = Depends(users_of),
    identities: IdentityRepository = Depends(identities_of),
    caller: Caller = Depends(require_bot),
) -> SessionOut:
    """201: created. With `if_exists: "return"`, 200 and the session that already has this
    `session_id` and the same owner, channel, group, project and parent. The owner is our user
    id (`owner_user_id`) or a platform identity (`owner`), named on first sight."""
    owner_user_id = person_user_id(
        identities, users, body.owner_user_id, body.owner,
        field="owner_user_id", person_field="owner", actor=caller.actor, required=True,
    )  # fmt: skip
    assert owner_user_id is not None
    new = NewSession(
        owner_user_id=owner_user_id,
        channel=body.channel,
        session_id=body.session_id,
        project_id=body.project_id,
        group=body.group.ref() if body.group else None,
        parent_session_id=body.parent_session_id,
        title=body.title,
    )
    if body.if_exists == "return":
        record, created = sessions.create_or_get(new, actor=caller.actor, acting_user=acting)
        response.status_code = 201 if created else 200
    else:
        record = sessions.create(new, actor=caller.actor, acting_user=acting)
    return session_out(identities, record)


@router.get("/v1/sessions/{session_id}", response_model=SessionOut, tags=["sessions"])
def get_session(
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    identities: IdentityRepository = Depends(identities_of),
    _: Caller = Depends(require_bot),
) -> SessionOut:
    return session_out(identities, sessions.get(session_id, acting_user=acting))


@router.patch("/v1/sessions/{session_id}", response_model=SessionOut, tags=["sessions"])
def patch_session(
    body: SessionPatch,
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    identities: IdentityRepository = Depends(identities_of),
    caller: Caller = Depends(require_bot),
) -> SessionOut:
    sessions.get(session_id, acting_user=acting, owner_only=True)
    changes = body.model_dump(exclude_unset=True)
    return session_out(identities, sessions.update(session_id, changes, actor=caller.actor))


@router.get("/v1/sessions", response_model=SessionListOut, tags=["sessions"])
def list_sessions(
    owner_user_id: int | None = Query(None, gt=0, le=ids.MAX_USER_ID, json_schema_extra={ABSOLUTE_CAP: True}),
    project_id: str | None = Query(None, max_length=200),
    channel: str | None = Query(None, max_length=200, description="with chat_id: a group chat's sessions"),
    chat_id: str | None = Query(None, max_length=200),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    identities: IdentityRepository = Depends(identities_of),
    _: Caller = Depends(require_bot),
) -> SessionListOut:
    """The live sessions of one owner in one scope (personal without `project_id`), newest first.

    With `X-Acting-User` the owner is that user; asking for another owner then lists nothing.
    With `channel` and `chat_id`: the group chat's sessions, whoever owns them (with
    `X-Acting-User`, only for a member of the group).
    """
    if channel is not None or chat_id is not None:
        return group_sessions(sessions, identities, channel, chat_id, acting)
    if project_id is not None:
        project_id = ids.project_id(project_id, "project_id")
    listing = SessionListOut.model_validate(
        sessions.list(SessionListRequest(owner_user_id, project_id, acting_user=acting))
    )
    with_session_identities(identities, listing.sessions)
    return listing


@router.delete("/v1/sessions/{session_id}", response_model=DeletedOut, tags=["sessions"])
def delete_session(
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    caller: Caller = Depends(require_bot),
) -> DeletedOut:
    """Tombstone, then cleanup (docs/sessions.md). 503 `session_cleanup_pending`: repeat to continue."""
    record = sessions.delete(session_id, acting_user=acting, actor=caller.actor)
    return DeletedOut(session_id=record.session_id, deleted=True, cleanup_done=record.cleanup_done_at is not None)


@router.post("/v1/sessions/{session_id}/messages", response_model=AppendOut, tags=["sessions"])
def append_messages(
    body: MessagesIn,
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    _: Caller = Depends(require_bot),
) -> AppendOut:
    result = sessions.append_messages(session_id, [m.new() for m in body.messages], acting_user=acting)
    return AppendOut.of(session_id, result)


@router.get("/v1/sessions/{session_id}/messages", response_model=MessagesOut, tags=["sessions"])
def read_messages(
    session_id: str = Depends(session_id_param),
    limit: int = Query(MESSAGES_READ_DEFAULT, ge=1, le=MESSAGES_READ_MAX),
    acting: int | None = Depends(acting_user),
    sessions: SessionService = Depends(sessions_of),
    _: Caller = Depends(require_bot),
) -> MessagesOut:
    """The last `limit` messages, oldest first."""
    window, total = sessions.messages(session_id, acting_user=acting, last=limit)
    return MessagesOut(session_id=session_id, total=total, messages=[MessageOut.model_validate(m) for m in window])


@router.post("/v1/sessions/{session_id}/runs", status_code=201, response_model=RunContextOut, tags=["runs"])
def start_run(
    body: RunStart,
    session_id: str = Depends(session_id_param),
    acting: int | None = Depends(acting_user),
    runs: RunService = Depends(runs_of),
    templates: TemplateService = Depends(templates_of),
    users: UserRepository = Depends(users_of),
    identities: IdentityRepository = Depends(identities_of),
    caller: Caller = Depends(require_bot),
) -> RunContextOut:
    if body.template is not None:
        templates.check_requestable(body.template)  # refused before anything changes
    speaker = person_user_id(
        identities, users, body.speaker_user_id, body.speaker,
        field="speaker_user_id", person_field="speaker", actor=caller.actor, required=False,
    )  # fmt: skip
    context = runs.start(
        session_id,
        StartRun(
            trigger=body.trigger,
            speaker_user_id=speaker,
            agent_id=body.agent_id,
            delivery_id=body.delivery_id,
            template=body.template,
        ),
        actor=caller.actor,
        acting_user=acting,
    )
    out = RunContextOut.model_validate(context)
    with_run_identities(identities, [out])
    return out


@router.get("/v1/runs/{run_id}", response_model=RunOut, tags=["runs"])
def get_run(
    run_id: str = Depends(run_id_param),
    acting: int | None = Depends(acting_user),
    reach: RunReach = Depends(run_reach_of),
    identities: IdentityRepository = Depends(identities_of),
    _: Caller = Depends(require_bot),
) -> RunOut:
    return run_out(identities, visible_run(reach, run_id, acting))


@router.post("/v1/runs/{run_id}/end", response_model=RunOut, tags=["runs"])
def end_run(
    body: RunEnd | None = None,
    run_id: str = Depends(run_id_param),
    acting: int | None = Depends(acting_user),
    reach: RunReach = Depends(run_reach_of),
    runs: RunService = Depends(runs_of),
    identities: IdentityRepository = Depends(identities_of),
    caller: Caller = Depends(require_bot),
) -> RunOut:
    own_run(reach, run_id, acting, owner_too=True)
    status = RunStatus((body or RunEnd()).status)
    return run_out(identities, runs.end(run_id, status, actor=caller.actor))


@router.get("/v1/tools", tags=["tools"])
def list_tools(
    names: str | None = Query(
        None, max_length=MAX_TOOL_SUBSET_CHARS, description="comma-separated: only these tools (an unknown name is a 422)"
    ),
    tools: ToolRegistry = Depends(tools_of),
    api: ApiSettings = Depends(api_settings_of),
    _: Caller = Depends(require_bot),
) -> dict:
    wanted = tool_subset(names, tools.names())
    described = tools.describe(shell_timeout_max_s=api.tool_timeout_max_s)
    return {"tools": [tool for tool in described if wanted is None or tool["name"] in wanted]}


# `{name:path}`: a name with a `/` (models invent any string) still reaches the dispatcher,
# which answers it as an unknown tool instead of a framework 404.
TOOL_CALL_PATH = "/v1/runs/{run_id}/tools/{name:path}"
TOOL_NAME_MAX_CHARS = 100


@router.post(TOOL_CALL_PATH, tags=["tools"], response_model=ToolCallOut)
async def call_tool(
    body: ToolCallIn,
    request: Request,
    run_id: str = Depends(run_id_param),
    name: str = Path(..., max_length=TOOL_NAME_MAX_CHARS),
    acting: int | None = Depends(acting_user),
    parts: ToolCallParts = Depends(tool_call_parts_of),
    caller: Caller = Depends(require_bot),
) -> Response:
    return await answer_tool_call(parts, run_id, name, body, caller, request.headers.get("accept"), acting)


async def answer_tool_call(
    parts: ToolCallParts, run_id: str, name: str, body: ToolCallIn, caller: Caller, accept: str | None,
    person: int | None,
) -> Response:  # fmt: skip
    """A tool call's answer, once its request is known to be well formed (this route and the
    fast path of orchestrator/http/tool_call_fast_path.py both end here). `person`: the
    `X-Acting-User`, checked against the run where the dispatcher reads it (a streamed call's
    route also checks it first, before the stream's descriptors are held)."""
    # The hot path (docs/performance.md): the dispatcher awaits the sandbox on the loop and does its
    # blocking work in threads of its own, never in the default pool; its outcome is plain
    # JSON already, so it skips FastAPI's response validation.
    if name in STREAMED_TOOLS and wants_events(accept):  # docs/processes.md
        if person is not None:  # before the stream's descriptors are held for the run's user
            await run_in_threadpool(own_run, parts, run_id, person)
        return await stream_tool_call(
            lambda on_output: parts.dispatcher.dispatch_async(
                run_id, name, body.arguments, tool_call_id=body.tool_call_id, actor=caller.actor, on_output=on_output,
                person=person,
            ),
            await hold_stream_descriptors(parts, run_id),
        )
    outcome = await parts.dispatcher.dispatch_async(
        run_id, name, body.arguments, tool_call_id=body.tool_call_id, actor=caller.actor, stream=True, person=person
    )
    if outcome.stream is not None:  # a large read_bytes: verified in its spool, sent from there
        return StreamedReadBytesResponse(outcome.stream)
    return JSONResponse(outcome.body())


def group_sessions(
    sessions: SessionService, identities: IdentityRepository, channel: str | None, chat_id: str | None, acting: int | None
) -> SessionListOut:
    if channel is None or chat_id is None:
        raise InvalidInput("channel and chat_id go together", field="chat_id" if chat_id is None else "channel")
    group = GroupRef(ids.name(channel, "channel"), ids.chat_id(chat_id, "chat_id"))
    records = sessions.list_for_group(group, acting)
    listing = SessionListOut(owner_user_id=None, project_id=None, sessions=[SessionOut.model_validate(r) for r in records])
    with_session_identities(identities, listing.sessions)
    return listing


def session_out(identities: IdentityRepository, record: object) -> SessionOut:
    out = SessionOut.model_validate(record)
    with_session_identities(identities, [out])
    return out


def run_out(identities: IdentityRepository, record: object) -> RunOut:
    out = RunOut.model_validate(record)
    with_run_identities(identities, [out])
    return out
