"""One structured line per request (docs/operations.md, "Access log"):

    access method=GET route=/v1/sessions/{session_id} status=200 duration_ms=1.9 request_id=… acting_user=17

`route` is the matched route's template, never the raw path (ids stay out of the access log,
and lines group by route); `-` for a request no route matched. The request id is the one the
request-id layer gives every request (`request_id.give_request_id`). A plain ASGI middleware: it
adds no task and reads nothing of the body.
"""

from __future__ import annotations

import logging
import time

from orchestrator.http.auth import parse_acting_user
from orchestrator.users.identities import PlatformIdentity
from orchestrator.http.request_guard import ASGIApp, Message, Receive, Scope, Send
from orchestrator.http.request_id import give_request_id
from orchestrator.log import kv

log = logging.getLogger("orchestrator.access")


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in scope.get("headers") or () if key == name]


def acting_user_field(scope: Scope) -> str | int | None:
    """The acting user as the routes read it; `invalid` for a header they refuse (422)."""
    try:
        acting = parse_acting_user(_headers(scope, b"x-acting-user"))
    except Exception:  # noqa: BLE001 - the route answers it; the log only notes it
        return "invalid"
    return acting.header_value() if isinstance(acting, PlatformIdentity) else acting


def route_template(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "-"


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = give_request_id(scope)
        status = 0  # no response started: the app failed, or the client left first

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            if log.isEnabledFor(logging.INFO):  # nothing formatted when the level hides it
                self._log(scope, status, started, request_id)

    @staticmethod
    def _log(scope: Scope, status: int, started: float, request_id: str) -> None:
        fields = kv(
            method=scope["method"],
            route=route_template(scope),
            status=status or 500,
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
            request_id=request_id,
            acting_user=acting_user_field(scope),
        )
        log.info("access %s", fields)
