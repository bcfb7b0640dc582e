"""`/v1/runs/{run_id}/mcp`: the MCP endpoint of a run (docs/mcp.md).

An ASGI app of its own (the SDK's transport answers), not a FastAPI route, so it is not in the
OpenAPI document. Before the SDK sees anything, the request passes the checks of the run's
tool route: the bearer token (any valid role, as `require_bot`), a valid run id, and with
`X-Acting-User` only the run's person. A refusal is the API's error shape.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from mounts import ids
from orchestrator.errors import InvalidInput, OrchestratorError, Unauthorized
from orchestrator.http.acting import own_run
from orchestrator.http.auth import caller_for, parse_acting_user
from orchestrator.http.request_guard import body_limit, replay_body
from orchestrator.http.stream_descriptors import hold_stream_descriptors
from orchestrator.mcp.caller import McpCaller
from orchestrator.http.parts import ApiParts
from orchestrator.mcp.endpoint import McpEndpoint, wants_stream
from orchestrator.mcp.server import McpParts
from orchestrator.tools.registry import tool_subset
from orchestrator.users.identities import PlatformIdentity

PATH = "/v1/runs/{run_id}/mcp"
# POST only: the transport is stateless, so there is no standalone stream to GET (it would
# only hold a connection open) and no session to DELETE; both are 405, as the protocol allows.
METHODS = ["POST"]


class McpRoute:
    def __init__(self, parts: ApiParts, endpoint: McpEndpoint) -> None:
        self._parts = parts  # the token, the run and its person, the tools, a stream's descriptors
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            caller = await self._caller(scope)
        except OrchestratorError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
            await JSONResponse({"error": exc.body()}, status_code=exc.status_code, headers=headers)(scope, receive, send)
            return
        body = await _whole_body(receive)
        stream = wants_stream(body)
        hold = None
        if stream:  # an SSE answer holds its connection as long as the call runs
            try:
                hold = await hold_stream_descriptors(self._parts, caller.run_id)
            except OrchestratorError as exc:
                await JSONResponse({"error": exc.body()}, status_code=exc.status_code)(scope, receive, send)
                return
        try:
            await self._endpoint.handle(caller, scope, replay_body(body, receive), send, stream=stream)
        finally:
            if hold is not None:
                hold.release()

    async def _caller(self, scope: Scope) -> McpCaller:
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        authorization = [v for k, v in headers if k == "authorization"]
        caller = caller_for(self._parts.api, authorization[0] if len(authorization) == 1 else None)
        if caller is None:
            raise Unauthorized("missing or wrong bearer token")
        try:
            run_id = ids.session_id(scope.get("path_params", {}).get("run_id"), "run_id")
        except ids.InvalidIdentifier as exc:
            raise InvalidInput(exc.message, field=exc.field) from None
        declared = parse_acting_user([v for k, v in headers if k == "x-acting-user"])
        acting: int | None
        if isinstance(declared, PlatformIdentity):
            record = await run_in_threadpool(self._parts.identities.sight, declared)
            acting = record.user_id
        else:
            acting = declared
        if acting is not None:  # the person of the run only, as on the tool route
            await run_in_threadpool(own_run, self._parts, run_id, acting)
        subset = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("tools")
        if subset is not None and len(subset) != 1:
            raise InvalidInput("send the tools query parameter once", field="tools")
        tools = tool_subset(subset[0] if subset else None, self._parts.tools.names(), field="tools")
        return McpCaller(run_id=run_id, actor=caller.actor, acting_user=acting, tools=tools)


async def _whole_body(receive: Receive) -> bytes:
    """The body the request guard has read already, within this route's cap (body_limit)."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


def mount_mcp(app: FastAPI, parts: ApiParts) -> McpEndpoint:
    """Add the route; the caller enters the returned endpoint's `running()` in its lifespan."""
    server_parts = McpParts(runs=parts.runs, session_repo=parts.session_repo, tools=parts.tools, dispatcher=parts.dispatcher)
    endpoint = McpEndpoint(server_parts, parts.api, body_max=body_limit("POST", PATH.format(run_id="r"), parts.api))
    app.router.add_route(PATH, McpRoute(parts, endpoint), methods=METHODS, include_in_schema=False)
    return endpoint
