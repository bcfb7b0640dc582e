"""Validated path parameters: an id that fails validation is a 422 before anything else runs.
The declared pattern and length put the rule into the OpenAPI document (the pattern only there:
the schema validator's regex engine has no look-ahead); the ids validators stay the authority and
name the field."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from mounts import ids
from orchestrator.errors import InvalidInput, NotFound
from orchestrator.http.parts import identities_of, users_of
from orchestrator.users.identities import IdentityRepository, parse_platform_identity
from orchestrator.users.repository import UserRepository

# The largest integer SQLite stores: a cursor or count above it cannot name a row, and binding it
# raises OverflowError (a 500) instead of a clear 422.
SQLITE_INT_MAX = 2**63 - 1


async def session_id_param(session_id: str = Path(..., max_length=128, json_schema_extra={"pattern": ids.SESSION_ID_PATTERN})) -> str:
    return ids.session_id(session_id, "session_id")


async def run_id_param(run_id: str = Path(..., max_length=128, json_schema_extra={"pattern": ids.SESSION_ID_PATTERN})) -> str:
    return ids.session_id(run_id, "run_id")


async def user_id_param(
    user_id: Annotated[int, Field(gt=0, le=ids.MAX_USER_ID)] | Annotated[str, Field(max_length=ids.PERSON_MAX_CHARS, json_schema_extra={"pattern": ids.PERSON_PATTERN})] = Path(
        ..., description="Our user id, or a person's platform identity as `{platform}:{id}` (e.g. `slack:U024BE7LH`)"
    ),
    users: UserRepository = Depends(users_of),
    identities: IdentityRepository = Depends(identities_of),
) -> int:
    """A user named by our integer id or by `{platform}:{id}`; a platform identity no bot has
    named yet is a 404 (`PUT /v1/identities/{platform}/{id}` names it); a purged user is a 410."""
    found = await purged_or_live_user_id_param(user_id, identities)
    return users.purged.refuse(found)


async def purged_or_live_user_id_param(
    user_id: Annotated[int, Field(gt=0, le=ids.MAX_USER_ID)] | Annotated[str, Field(max_length=ids.PERSON_MAX_CHARS, json_schema_extra={"pattern": ids.PERSON_PATTERN})] = Path(
        ..., description="Our user id, or a person's platform identity as `{platform}:{id}` (e.g. `slack:U024BE7LH`)"
    ),
    identities: IdentityRepository = Depends(identities_of),
) -> int:
    """As `user_id_param`, a purged user too (a purge repeated to finish its cleanup)."""
    # The union's str member takes "17" too (an exact type match): digits are a user id.
    if isinstance(user_id, str) and user_id.isdecimal() and user_id.isascii():
        user_id = int(user_id)
    if isinstance(user_id, int):
        try:
            return ids.user_id(user_id, "user_id")
        except ids.InvalidIdentifier as exc:
            raise InvalidInput(exc.message, field=exc.field) from None
    identity = parse_platform_identity(user_id, "user_id")
    record = await run_in_threadpool(identities.get, identity)
    if record is None:
        raise NotFound(f"no user is known as {identity.header_value()}", field="user_id")
    return record.user_id


async def project_id_param(project_id: str = Path(..., max_length=64, json_schema_extra={"pattern": ids.PROJECT_ID_PATTERN})) -> str:
    return ids.project_id(project_id, "project_id")


def skill_name_param(name: str = Path(..., max_length=64, json_schema_extra={"pattern": ids.NAME_PATTERN})) -> str:
    return ids.name(name, "name")


async def group_channel_param(channel: str = Path(..., max_length=64, json_schema_extra={"pattern": ids.NAME_PATTERN})) -> str:
    return ids.name(channel, "channel")


async def chat_id_param(chat_id: str = Path(..., max_length=128, json_schema_extra={"pattern": ids.CHAT_ID_PATTERN})) -> str:
    return ids.chat_id(chat_id, "chat_id")
