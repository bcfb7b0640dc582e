"""A request id on every request and every response (`X-Request-Id`), so a bot's report of a
failure can be found in the server log (docs/api.md, "Errors").

The outermost layer of the app: it sees every response, including the guard's early refusals
and the framework's own 404/405. A caller's own `X-Request-Id` is kept when it is a short token
of safe characters (so a bot can correlate its own logs); anything else is replaced, since the
id is written into log lines.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import MutableMapping
from typing import Any

from orchestrator.http.request_guard import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
_CALLER_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")


def choose_request_id(offered: bytes | None) -> str:
    """Pure: the caller's id when it is safe to log, else a fresh one."""
    if offered is not None and _CALLER_ID.fullmatch(offered):
        return offered.decode("ascii")
    return uuid.uuid4().hex


def request_id_of(scope: MutableMapping[str, Any]) -> str | None:
    """The id this layer gave the request (None outside it, e.g. a bare test app)."""
    return scope.get("state", {}).get("request_id")


def give_request_id(scope: MutableMapping[str, Any]) -> str:
    """The request's id: the one already given, else chosen from the caller's `X-Request-Id`
    (only a single one is kept: two would let a proxy and this server log different ones).
    Stored in the scope's state, which the Request objects the app builds share, so the error
    handlers (including the one for 500s) and the access log read the same id."""
    given = request_id_of(scope)
    if given:
        return str(given)
    offered = [value for key, value in scope.get("headers") or () if key == HEADER]
    request_id = choose_request_id(offered[0] if len(offered) == 1 else None)
    scope.setdefault("state", {})["request_id"] = request_id
    return request_id


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = (HEADER, give_request_id(scope).encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        await self.app(scope, receive, send_with_id)
