"""The tool call's fast path: `POST /v1/runs/{run_id}/tools/{name}` when the request is well
formed, served without the framework's per-request machinery.

A tool call is the one route a model calls thousands of times a run. FastAPI spends a fifth of
the server's time on it resolving the route's dependencies (the token, the run id, the acting
person, the body model) and matching it against every route before it. This route sits first
in the router and answers the common request itself: a valid token, a well-formed run id and
tool name, at most an `X-Acting-User` naming a user id, a JSON body that `ToolCallIn` accepts.
The answer is the same one (`routes_sessions.answer_tool_call` builds it for both; the person
is checked where the dispatcher reads the run). Anything else (a wrong token, a bad id, a body
the model refuses, a platform identity to name) goes on to the framework's route untouched, so
every refusal keeps the exact shape and status the OpenAPI document and docs/api.md give. The
middlewares (request id, access log, the body guard) and the error handlers run as for any route.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.routing import Match, Route

from mounts import ids
from orchestrator.errors import OrchestratorError
from orchestrator.http.auth import caller_for, parse_acting_user
from orchestrator.http.models import ToolCallIn
from orchestrator.http.parts import ApiParts
from orchestrator.http.request_guard import Receive, Scope, Send, replay_body
from orchestrator.http.routes_sessions import TOOL_CALL_PATH, TOOL_NAME_MAX_CHARS, answer_tool_call

_PASSED_ON = "orchestrator.tool_call_passed_on"  # set on a scope this path handed to the framework


def well_formed(run_id: str, name: str, headers: dict[bytes, bytes], body: bytes) -> ToolCallIn | None:
    """The body of a request the framework's route would accept as it is, else None (pure)."""
    if len(name) > TOOL_NAME_MAX_CHARS:
        return None
    try:
        ids.session_id(run_id, "run_id")
    except ids.InvalidIdentifier:
        return None
    media_type, _, _ = headers.get(b"content-type", b"").decode("latin-1").partition(";")
    if media_type.strip().lower() != "application/json":
        return None
    try:
        parsed = json.loads(body)  # the parser FastAPI uses, so the same documents are accepted
        return ToolCallIn.model_validate(parsed) if isinstance(parsed, dict) else None
    except (ValueError, ValidationError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def plain_person(value: str) -> int | None:
    """An `X-Acting-User` naming our user id as the route takes it, else None (a platform
    identity is named on first sight, a malformed one refused: the framework's route does both)."""
    try:
        person = parse_acting_user([value])
    except OrchestratorError:
        return None
    return person if isinstance(person, int) else None


class ToolCallFastPath(Route):
    """A route placed before every other: serves what `well_formed` accepts, passes the rest on
    to the router again (which then skips this route)."""

    def __init__(self, parts: ApiParts, router: Any) -> None:
        super().__init__(TOOL_CALL_PATH, endpoint=self._serve_asgi, methods=["POST"], include_in_schema=False)
        self.app = self._serve_asgi  # plain ASGI: no Request object, no dependency solving
        self._parts = parts  # the parts the framework's route depends on, the same objects
        self._router = router

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        # Another method is the framework's to answer (405 with its Allow header), as before.
        if scope.get(_PASSED_ON) or scope.get("method") != "POST":
            return Match.NONE, {}
        return super().matches(scope)

    async def _serve_asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])  # a repeated header: the request goes on (see below)
        caller = caller_for(self._parts.api, _header(headers, b"authorization"))
        body, ended = await _whole_body(receive)
        if not ended:  # the client left while sending: nobody to answer
            return
        params = scope["path_params"]
        call = None
        person = None
        if caller is not None and len(headers) == len(scope["headers"]):
            call = well_formed(params["run_id"], params["name"], headers, body)
            if b"x-acting-user" in headers:
                person = plain_person(headers[b"x-acting-user"].decode("latin-1"))
                if person is None or self._parts.users.purged.is_purged(person):  # the route's 422 or 410
                    call = None
        if call is None:  # the framework's route answers it, refusals and all
            scope[_PASSED_ON] = True
            await self._router(scope, replay_body(body, receive), send)
            return
        scope["route"] = self  # the access log's route template: the same path as the framework's route
        accept = _header(headers, b"accept")
        response = await answer_tool_call(self._parts, params["run_id"], params["name"], call, caller, accept, person)
        await response(scope, receive, send)


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return value.decode("latin-1") if value is not None else None


async def _whole_body(receive: Receive) -> tuple[bytes, bool]:
    """The body (the request guard has already read and bounded it: this is its replay) and
    whether it ended; False when the client left first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True
