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
from orchestrator.http.parts import api_settings_of, identities_of, users_of
from orchestrator.settings import ApiSettings
from orchestrator.users.identities import IdentityRepository, PlatformIdentity, parse_platform_identity
from orchestrator.users.repository import UserRepository


@dataclass(frozen=True)
class Caller:
    role: str  # bot | admin | local

    @property
    def actor(self) -> str:
        return self.role


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _matches(token: str, secret) -> bool:
    return secret is not None and hmac.compare_digest(token.encode(), secret.get_secret_value().encode())


def caller_for(api: ApiSettings, authorization: str | None) -> Caller | None:
    """The role an `Authorization` header gives, None for a missing or wrong token (the route
    dependencies below, and the ASGI apps of their own that check the token as `require_bot`
    does: the MCP endpoint, the tool call's fast path, the console)."""
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


def has_valid_token(api: ApiSettings, authorization: str | None) -> bool:
    """Whether the request may reach a `/v1/` route at all (any role); checked from the headers
    before the body is read (orchestrator/http/request_guard.py)."""
    return caller_for(api, authorization) is not None


async def optional_caller(
    api: ApiSettings = Depends(api_settings_of),
    authorization: str | None = Header(None, include_in_schema=False),
) -> Caller | None:
    """The caller's role, None without a right token (routes open to anyone)."""
    return caller_for(api, authorization)


async def require_bot(
    api: ApiSettings = Depends(api_settings_of),
    authorization: str | None = Header(None, include_in_schema=False),  # bearerAuth in the OpenAPI
) -> Caller:
    caller = caller_for(api, authorization)
    if caller is None:
        raise Unauthorized("missing or wrong bearer token")
    return caller


async def require_admin(
    api: ApiSettings = Depends(api_settings_of),
    authorization: str | None = Header(None, include_in_schema=False),  # bearerAuth in the OpenAPI
) -> Caller:
    caller = caller_for(api, authorization)
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
    users: UserRepository = Depends(users_of),
    identities: IdentityRepository = Depends(identities_of),
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
        record = await run_in_threadpool(identities.sight, acting)
        return users.admit(record.user_id, "X-Acting-User")
    if acting is not None:
        users.purged.refuse(acting, "X-Acting-User")
    return acting
