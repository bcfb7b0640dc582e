"""Bearer-token auth: the bot token for the API, the admin token for /v1/admin/*.

With no token configured at all, authentication is off and the server listens on loopback
only (enforced by `orchestrator serve`).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from typing import Annotated

from fastapi import Depends, Header, Request
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from mounts import ids
from orchestrator.errors import Forbidden, InvalidInput, Unauthorized
from orchestrator.http.openapi import ABSOLUTE_CAP
from orchestrator.service import OrchestratorService
from orchestrator.settings import ApiSettings, Settings
from orchestrator.users.identities import PlatformIdentity, parse_platform_identity


@dataclass(frozen=True)
class Caller:
    role: str  # bot | admin | local

    @property
    def actor(self) -> str:
        return self.role


async def service_of(request: Request) -> OrchestratorService:
    return request.app.state.service


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _matches(token: str, secret) -> bool:
    return secret is not None and hmac.compare_digest(token.encode(), secret.get_secret_value().encode())


def _caller(api: ApiSettings | Settings, authorization: str | None) -> Caller | None:
    if not api.auth_enabled:
        return Caller("local")
    token = _bearer(authorization)
    if token is None:
        return None
    if _matches(token, api.admin_token):
        return Caller("admin")
    if _matches(token, api.api_token):
        return Caller("bot")
    return None


def caller_for(api: ApiSettings | OrchestratorService, authorization: str | None) -> Caller | None:
    """The role an `Authorization` header gives, None for a missing or wrong token (for the
    MCP endpoint, an ASGI app of its own that checks the token as `require_bot` does, and the
    admin console). Takes the HTTP layer's ApiSettings; a service still, until the MCP endpoint
    and the tool call's fast path pass theirs (issue 26)."""
    return _caller(api if isinstance(api, ApiSettings) else api.settings, authorization)


def has_valid_token(settings: Settings, authorization: str | None) -> bool:
    """Whether the request may reach a `/v1/` route at all (any role); checked from the headers
    before the body is read (orchestrator/http/request_guard.py)."""
    if not settings.auth_enabled:
        return True
    token = _bearer(authorization)
    return token is not None and (_matches(token, settings.admin_token) or _matches(token, settings.api_token))


async def optional_caller(
    service: OrchestratorService = Depends(service_of),
    authorization: str | None = Header(None, include_in_schema=False),
) -> Caller | None:
    """The caller's role, None without a right token (routes open to anyone)."""
    return _caller(service.settings, authorization)


async def require_bot(
    service: OrchestratorService = Depends(service_of),
    authorization: str | None = Header(None, include_in_schema=False),  # bearerAuth in the OpenAPI
) -> Caller:
    caller = _caller(service.settings, authorization)
    if caller is None:
        raise Unauthorized("missing or wrong bearer token")
    return caller


async def require_admin(
    service: OrchestratorService = Depends(service_of),
    authorization: str | None = Header(None, include_in_schema=False),  # bearerAuth in the OpenAPI
) -> Caller:
    caller = _caller(service.settings, authorization)
    if caller is None:
        raise Unauthorized("missing or wrong bearer token")
    if caller.role == "bot":
        raise Forbidden("this route needs the admin token")
    return caller


_ACTING_USER = re.compile(r"[1-9][0-9]{0,9}")


def parse_acting_user(values: list[str]) -> int | PlatformIdentity | None:
    """Pure: the acting user from every `X-Acting-User` header of a request. Exactly one: a
    user id in plain decimal (no sign, no leading zero, no spaces: `int()` would also take
    "+67", " 67" or "6_7"), or a platform identity `{platform}:{id}`. Two headers would let a
    proxy and the app disagree on who is acting."""
    if not values:
        return None
    if len(values) != 1:
        raise InvalidInput("send exactly one X-Acting-User header", field="X-Acting-User")
    value = values[0]
    if ":" in value:
        return parse_platform_identity(value, "X-Acting-User")
    if not _ACTING_USER.fullmatch(value):
        raise InvalidInput(
            "X-Acting-User must be a positive integer user id or {platform}:{id}", field="X-Acting-User"
        )
    try:
        return ids.user_id(int(value), "X-Acting-User")
    except ids.InvalidIdentifier as exc:
        raise InvalidInput(exc.message, field=exc.field) from None


async def acting_user(
    request: Request,
    _caller: Caller = Depends(require_bot),  # a platform identity is named only for an authenticated caller
    # The declared parameter puts the header into the OpenAPI document; the raw headers stay the
    # authority, since a lax integer parse would take "+67" and would not see a second header.
    _declared: Annotated[int, Field(ge=1, le=ids.MAX_USER_ID, json_schema_extra={ABSOLUTE_CAP: True})]
    | Annotated[str, Field(max_length=ids.PERSON_MAX_CHARS, json_schema_extra={"pattern": ids.PERSON_PATTERN})] = Header(  # type: ignore[assignment]
        None,
        alias="X-Acting-User",
        description="The person this request is made for (docs/decisions.md, X-Acting-User): our user id, "
        "or `{platform}:{id}` (a platform identity, named on first sight).",
    ),
) -> int | None:
    """`X-Acting-User: {uid}` or `{platform}:{id}`: the person a request is made for. With it,
    every person-facing route acts for that person only (docs/decisions.md lists them). A
    platform identity seen for the first time gets its user id here, as on a session's owner."""
    del _declared
    acting = parse_acting_user(request.headers.getlist("x-acting-user"))
    if isinstance(acting, PlatformIdentity):
        service = request.app.state.service
        record = await run_in_threadpool(service.identities.sight, acting)
        return service.users.admit(record.user_id, "X-Acting-User")
    if acting is not None:
        request.app.state.service.users.purged.refuse(acting, "X-Acting-User")
    return acting
